"""One prompt's speculative selection: the draft reads the request in its own format and
scores its tokens, the best chunks are kept, their characters are carried to the target's text
through the request's pieces, and the target keeps the tokens that touch them."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from snapstream.cancel import Cancel
from snapstream.engine import Engine
from snapstream.specprefill.chunks import chunk_bounds, rank_chunks
from snapstream.specprefill.mapping import (
    carry_spans,
    char_mask,
    check_offsets,
    chunk_spans,
    tokens_touching,
)
from snapstream.specprefill.pieces import Rendering, Request, links, render_own
from snapstream.specprefill.scoring import score_prompt
from snapstream.specprefill.settings import SpeculativeSettings
from snapstream.tokenizer import Tokenizer

# position mode -> the positions the target prefills its kept tokens at (None: 0..K-1)
POSITIONS: dict[str, Callable[[list[int]], list[int] | None]] = {
    "original": lambda kept: kept,
    "compact": lambda kept: None,
}


@dataclass(frozen=True)
class Selection:
    ids: list[int]  # the target tokens to prefill
    indices: list[int]  # their indices in the whole prompt's target tokens
    positions: list[int] | None  # their positions; None: 0..len(ids)-1
    position_mode: str  # the settings' mode that gave ``positions`` (POSITIONS' key)
    num_prompt_tokens: int  # the target's tokens in the whole prompt
    draft_s: float
    skipped: str = ""  # why the prompt was prefilled whole ("" when the draft selected)

    @property
    def kept_share(self) -> float:
        return len(self.ids) / self.num_prompt_tokens


class PromptTooLongForDraft(ValueError):
    """The prompt, as the draft reads it, is longer than the draft's context."""


@dataclass(frozen=True)
class DraftRanking:
    """The draft's verdict on one request: its own rendering of it, its tokens' character
    spans in that text and their scores; ``skipped`` says why there are none."""

    draft_view: Rendering
    offsets: torch.Tensor  # (N, 2) [start, end) characters of draft_view.text
    scores: torch.Tensor  # (N,) float; empty when skipped
    chunk_size: int
    draft_s: float
    skipped: str = ""


class DraftSelector:
    """Holds the draft engine: :meth:`rank` runs it over a request, :func:`pick` maps a ranking
    to the target's tokens for a budget; :meth:`select` does both."""

    def __init__(self, draft: Engine, path: Path | None = None) -> None:
        self.draft = draft
        self.path = path  # the draft's checkpoint, when a request may name it

    def select(self, request: Request, target_view: Rendering, target: Tokenizer,
               settings: SpeculativeSettings, keep_from_char: int | None = None,
               cancel: Cancel | None = None) -> Selection:
        """``target_view``: the prompt as the target reads it, its pieces located (see
        :func:`pick`). ValueError when a tokenizer gives no character offsets;
        PromptTooLongForDraft when the draft's rendering is longer than its context;
        Cancelled once ``cancel`` is set (checked each layer and look-ahead step)."""
        return pick(self.rank(request, settings, cancel), target_view, target, settings,
                    keep_from_char)

    def rank(self, request: Request, settings: SpeculativeSettings,
             cancel: Cancel | None = None) -> DraftRanking:
        """The draft's scores of its tokens of ``request`` as it reads it (``settings``'
        look-ahead and kernel; :func:`pick` chunks them by ``settings.chunk_size``)."""
        start = time.perf_counter()
        view = render_own(self.draft.tokenizer, request)
        draft_ids, draft_spans = self.draft.tokenizer.encode_with_offsets(view.text)
        draft_offsets = torch.tensor(draft_spans, dtype=torch.int64).view(-1, 2)  # (N, 2)
        check_offsets(draft_offsets, len(view.text), "draft model")
        num_text_tokens = _num_text_tokens(view, draft_offsets)
        if num_text_tokens < settings.chunk_size:
            return DraftRanking(view, draft_offsets, torch.zeros(0), settings.chunk_size,
                                time.perf_counter() - start,
                                skipped=f"prompt shorter than one chunk ({num_text_tokens} < "
                                        f"{settings.chunk_size} draft tokens): prefilled whole")
        if len(draft_ids) > self.draft.context_len:
            raise PromptTooLongForDraft(f"prompt has {len(draft_ids)} draft tokens; the draft's "
                                        f"context is {self.draft.context_len}: shorten it")
        scores = score_prompt(self.draft.model, draft_ids, settings.look_ahead, settings.kernel,
                              set(self.draft.tokenizer.eos_token_ids),
                              self.draft.prefill_dtype, cancel).scores  # (N,)
        return DraftRanking(view, draft_offsets, scores, settings.chunk_size,
                            time.perf_counter() - start)


def pick(ranking: DraftRanking, target_view: Rendering, target: Tokenizer,
         settings: SpeculativeSettings, keep_from_char: int | None = None) -> Selection:
    """The target tokens of the best chunks that fit ``settings``' budget, with the always-kept
    ones: tokens the text does not spell (BOS), special tokens, and all from ``keep_from_char``
    of ``target_view.text`` on (a chat prompt's final user turn)."""
    start, text = time.perf_counter(), target_view.text
    target_ids, target_spans = target.encode_with_offsets(text)
    target_offsets = torch.tensor(target_spans, dtype=torch.int64).view(-1, 2)  # (M, 2)
    check_offsets(target_offsets, len(text), "target model")
    if ranking.skipped:
        return Selection(target_ids, list(range(len(target_ids))), None, settings.positions,
                         len(target_ids), ranking.draft_s, skipped=ranking.skipped)
    forced = _forced_tokens(target, target_ids, target_offsets)
    if keep_from_char is not None:
        forced |= tokens_touching(target_offsets, char_mask(
            torch.tensor([[keep_from_char, len(text)]]), len(text)))
    shared = links(ranking.draft_view, target_view)
    ranked = _ranked_spans(ranking, shared)  # (C, 2)
    spans, chunk_idx = carry_spans(ranked, shared)
    kept = _fill(spans, chunk_idx, len(ranked), target_offsets, forced, len(text),
                 settings.budget(len(target_ids)))
    kept_idx = kept.nonzero()[:, 0].tolist()
    return Selection([target_ids[i] for i in kept_idx], kept_idx,
                     POSITIONS[settings.positions](kept_idx), settings.positions,
                     len(target_ids), ranking.draft_s + time.perf_counter() - start)


def _ranked_spans(ranking: DraftRanking, shared: list[tuple[int, int, int]]) -> torch.Tensor:
    """(C, 2) character spans of the draft's chunks, best first. The chunks tile the tokens
    whose text the target shares (``shared`` links); the draft's own template before and after
    them (a system turn, ``Answer:``), which maps to nothing, is a chunk of its own each, so
    that the text's first and last chunks, always kept, are text (a draft of the target's
    family shares all: its chunks are those of the whole prompt)."""
    offsets, num_tokens = ranking.offsets, len(ranking.offsets)
    linked = char_mask(torch.tensor([[a, a + n] for a, _, n in shared],
                                    dtype=torch.int64).view(-1, 2), len(ranking.draft_view.text))
    is_template = (offsets[:, 1] > offsets[:, 0]) & ~tokens_touching(offsets, linked)  # (N,)
    lead = int(is_template.long().cumprod(0).sum())
    trail = int(is_template.flip(0).long().cumprod(0).sum())
    start, end = (lead, num_tokens - trail) if lead + trail < num_tokens else (0, num_tokens)
    bounds = chunk_bounds(num_tokens, ranking.chunk_size, start, end)  # (C, 2)
    first = int(start > 0)
    last = first + math.ceil((end - start) / ranking.chunk_size) - 1
    order = rank_chunks(ranking.scores, bounds, (first, last))  # (C,)
    return chunk_spans(offsets, bounds)[order]


def _num_text_tokens(view: Rendering, offsets: torch.Tensor) -> int:
    """The draft's tokens of the request's text (its template's not counted)."""
    pieces = torch.tensor([[p.text_start, p.text_start + p.length] for p in view.pieces],
                          dtype=torch.int64).view(-1, 2)  # (P, 2)
    return int(tokens_touching(offsets, char_mask(pieces, len(view.text))).sum())


def _forced_tokens(target: Tokenizer, ids: list[int], offsets: torch.Tensor) -> torch.Tensor:
    """(M,) bool: the target tokens kept whatever the draft says: special tokens (a chat
    template's) and tokens the text does not spell (BOS)."""
    special = {i for i, token in target.inner.get_added_tokens_decoder().items() if token.special}
    is_special = torch.tensor([i in special for i in ids], dtype=torch.bool)
    return is_special | (offsets[:, 1] == offsets[:, 0])


def _fill(spans: torch.Tensor, chunk_idx: torch.Tensor, num_chunks: int,
          target_offsets: torch.Tensor, forced: torch.Tensor, text_len: int,
          budget: int) -> torch.Tensor:
    """spans (S, 2) target characters of the ranked chunks, chunk_idx (S,) each one's rank
    (ascending; the first two chunks are always kept) -> (M,) bool: the target tokens of the
    longest prefix of the ranking whose tokens fit ``budget`` (binary search: the count only
    grows with the prefix)."""
    def kept(prefix: int) -> torch.Tensor:
        num_spans = int(torch.searchsorted(chunk_idx, prefix))
        return forced | tokens_touching(target_offsets, char_mask(spans[:num_spans], text_len))

    low, high = min(2, num_chunks), num_chunks
    while low < high:  # largest n in [low, high] with count(n) <= budget, or low
        mid = (low + high + 1) // 2
        if int(kept(mid).sum()) <= budget:
            low = mid
        else:
            high = mid - 1
    return kept(low)
