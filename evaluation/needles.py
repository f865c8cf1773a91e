"""Failure analysis of a missed target: where a sample's needles and answers lie among its
prompt's tokens, how much of them a compressed cache holds, and how much of the observation
window's attention falls on them.

- ``needle_kept`` / ``answer_kept``: the share of the target needles' tokens (of the tokens
  spelling an answer inside them: a value, a function's name in its ``def``) that the cache
  holds, over every global layer and KV head (:func:`held_share`);
- ``needle_attention``: the share of SnapKV's votes (the last ``window`` prompt queries'
  attention to the keys before them, averaged over the window and each KV group's query heads,
  unpooled) that lands on the target needles' tokens, averaged over the global layers and KV
  heads (:func:`attention_share`); the window's own keys, which SnapKV always keeps, are left
  out. Where it is small, SnapKV could not have kept the needle; where it
  is large and the needle was kept but the answer is wrong, the loss lies elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evaldata import Sample
from snapstream.kvcache import SequenceCache


@dataclass(frozen=True)
class NeedleTokens:
    """Prompt positions of the target needles' tokens and of the answers' tokens inside them."""

    needle: tuple[int, ...]
    answer: tuple[int, ...]


def needle_tokens(offsets: list[tuple[int, int]], sample: Sample) -> NeedleTokens:
    """``offsets``: each prompt token's [start, end) characters in the sample's prompt (the
    tokenizer's ``encode_with_offsets`` of the prompt's head)."""
    targets = [needle for needle in sample.needles if needle.is_target]
    needle_spans = [(n.offset, n.offset + len(n.text)) for n in targets]
    answer_spans = [(n.offset + at, n.offset + at + len(answer))
                    for n in targets for answer in sample.answers
                    for at in _occurrences(n.text, answer)]
    return NeedleTokens(needle=_covering(offsets, needle_spans),
                        answer=_covering(offsets, answer_spans))


def _occurrences(text: str, part: str) -> list[int]:
    found, at = [], text.find(part)
    while at >= 0:
        found.append(at)
        at = text.find(part, at + 1)
    return found


def _covering(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> tuple[int, ...]:
    return tuple(i for i, (a, b) in enumerate(offsets)
                 if any(a < end and b > start for start, end in spans))


def held_share(cache: SequenceCache, tokens: tuple[int, ...] | list[int]) -> float | None:
    """The share of ``tokens`` (prompt positions) the cache holds, over every global layer and
    KV head (None without tokens)."""
    if not tokens:
        return None
    positions = cache.groups[0].positions.long()  # (L, Hkv, S), EMPTY = -1
    size = int(positions.max()) + 2
    held = torch.zeros(*positions.shape[:2], size, dtype=torch.bool,
                       device=positions.device)  # (L, Hkv, max position + 2)
    held.scatter_(2, torch.where(positions < 0, size - 1, positions), True)
    wanted = torch.tensor([t for t in tokens if t < size - 1], dtype=torch.long,
                          device=positions.device)
    return float(held[..., wanted].sum()) / (held.shape[0] * held.shape[1] * len(tokens))


def attention_share(scores: torch.Tensor, windows: tuple[int | None, ...],
                    tokens: tuple[int, ...]) -> float | None:
    """scores (L, Hkv, P): each layer's votes per prompt token; the mean over global layers
    (``windows[i]`` None) and KV heads of the share of votes on ``tokens`` (None without
    tokens)."""
    if not tokens:
        return None
    layers = [i for i, window in enumerate(windows) if window is None] or list(range(len(windows)))
    votes = scores[layers].float()  # (Lg, Hkv, P), +inf on the window's own keys
    votes = torch.where(votes.isfinite(), votes, 0.0)
    wanted = torch.tensor(tokens, dtype=torch.long, device=votes.device)
    share = votes[..., wanted].sum(-1) / votes.sum(-1).clamp(min=1e-30)  # (Lg, Hkv)
    return float(share.mean())
