"""Draft chunks -> target tokens through character offsets.

The draft and the target tokenize the same text differently, so a kept draft chunk is carried
over as the characters it covers (the hull of its tokens' spans, so that a gap a tokenizer left
between two tokens goes with them); a target token is kept when any of its characters is kept.
Tokens without characters (BOS, a special token the text does not spell) are decided by the
caller.
"""

from __future__ import annotations

import torch


def check_offsets(offsets: torch.Tensor, text_len: int, who: str) -> None:
    """offsets (N, 2) [start, end) character spans -> ValueError unless they lie in the text
    and, for a non-empty text, some token covers a character."""
    if offsets.numel() and (offsets.min() < 0 or offsets.max() > text_len
                            or bool((offsets[:, 1] < offsets[:, 0]).any())):
        raise ValueError(f"{who}: its tokenizer gives character offsets outside the text")
    if text_len and not bool((offsets[:, 1] > offsets[:, 0]).any()):
        raise ValueError(f"{who}: its tokenizer gives no character offsets; speculative "
                         "prefill maps tokens through them, so use a draft whose does")


def chunk_spans(offsets: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """offsets (N, 2) of the draft's tokens, bounds (C, 2) token ranges -> (C, 2) character
    hulls [start, end) of each chunk's non-empty token spans (empty (0, 0) when it has none)."""
    has_chars = offsets[:, 1] > offsets[:, 0]  # (N,)
    big = torch.iinfo(torch.int64).max
    starts = torch.where(has_chars, offsets[:, 0], big)  # (N,)
    ends = torch.where(has_chars, offsets[:, 1], -1)
    hulls = []
    for begin, end in bounds.tolist():
        start, stop = int(starts[begin:end].min()), int(ends[begin:end].max())
        hulls.append((start, stop) if stop > 0 else (0, 0))
    return torch.tensor(hulls, dtype=torch.int64).view(-1, 2)


def char_mask(spans: torch.Tensor, text_len: int) -> torch.Tensor:
    """spans (K, 2) [start, end) -> (text_len,) bool, True on every character of a span."""
    edges = torch.zeros(text_len + 1, dtype=torch.int64)
    edges.index_add_(0, spans[:, 0], torch.ones(len(spans), dtype=torch.int64))
    edges.index_add_(0, spans[:, 1], -torch.ones(len(spans), dtype=torch.int64))
    return edges.cumsum(0)[:text_len] > 0


def tokens_touching(offsets: torch.Tensor, chars: torch.Tensor) -> torch.Tensor:
    """offsets (M, 2) of the target's tokens, chars (T,) bool -> (M,) bool: the tokens with at
    least one kept character."""
    counts = torch.nn.functional.pad(chars.long().cumsum(0), (1, 0))  # (T + 1,)
    return counts[offsets[:, 1]] > counts[offsets[:, 0]]


def carry_spans(spans: torch.Tensor, links: list[tuple[int, int, int]]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """spans (C, 2) [start, end) characters of one text, links (source_start, dest_start,
    length) to another (:func:`~snapstream.specprefill.pieces.links`) -> the spans' parts in the
    other text (S, 2) and the index of the span each came from (S,), in order of that index;
    characters outside every link are dropped."""
    table = torch.tensor(links, dtype=torch.int64).view(-1, 3)  # (L, 3)
    src, shift = table[:, 0], table[:, 1] - table[:, 0]  # (L,)
    lo = torch.maximum(spans[:, :1], src)  # (C, L)
    hi = torch.minimum(spans[:, 1:], src + table[:, 2])  # (C, L)
    span_idx, link_idx = (hi > lo).nonzero(as_tuple=True)  # (S,) each, by span then link
    moved = torch.stack((lo[span_idx, link_idx], hi[span_idx, link_idx]), dim=1)  # (S, 2)
    return moved + shift[link_idx, None], span_idx
