"""One prompt's speculative selection: the draft scores its own tokens, the best chunks are
kept, and the target keeps the tokens that touch their characters."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from snapstream.engine import Engine
from snapstream.specprefill.chunks import chunk_bounds, rank_chunks
from snapstream.specprefill.mapping import (
    char_mask,
    check_offsets,
    chunk_spans,
    tokens_touching,
)
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
    positions: list[int] | None  # their positions; None: 0..len(ids)-1
    num_prompt_tokens: int  # the target's tokens in the whole prompt
    draft_s: float
    skipped: str = ""  # why the prompt was prefilled whole ("" when the draft selected)

    @property
    def kept_share(self) -> float:
        return len(self.ids) / self.num_prompt_tokens


@dataclass(frozen=True)
class DraftRanking:
    """The draft's verdict on one text: its chunks as character spans, best first (the first
    and the last chunk lead); ``skipped`` says why there is none (then no chunk)."""

    text: str
    ranked_spans: torch.Tensor  # (C, 2) [start, end) characters
    draft_s: float
    skipped: str = ""


class DraftSelector:
    """Holds the draft engine: :meth:`rank` runs it over a text, :func:`pick` maps a ranking
    to the target's tokens for a budget; :meth:`select` does both."""

    def __init__(self, draft: Engine) -> None:
        self.draft = draft

    def select(self, text: str, target: Tokenizer, settings: SpeculativeSettings,
               keep_from_char: int | None = None) -> Selection:
        """``text``: the whole prompt (a chat prompt as rendered); ``keep_from_char``: where
        its final user turn starts (kept with all that follows). ValueError when a tokenizer
        gives no character offsets or the prompt is longer than the draft's context."""
        return pick(self.rank(text, settings), target, settings, keep_from_char)

    def rank(self, text: str, settings: SpeculativeSettings) -> DraftRanking:
        """The draft's chunks of ``text`` (``settings``' chunk size, look-ahead, kernel)."""
        start = time.perf_counter()
        draft_ids, draft_spans = self.draft.tokenizer.encode_with_offsets(text)
        draft_offsets = torch.tensor(draft_spans, dtype=torch.int64).view(-1, 2)  # (N, 2)
        check_offsets(draft_offsets, len(text), "draft model")
        if len(draft_ids) < settings.chunk_size:
            return DraftRanking(text, torch.zeros(0, 2, dtype=torch.int64),
                                time.perf_counter() - start,
                                skipped=f"prompt shorter than one chunk ({len(draft_ids)} < "
                                        f"{settings.chunk_size} draft tokens): prefilled whole")
        if len(draft_ids) > self.draft.context_len:
            raise ValueError(f"prompt has {len(draft_ids)} draft tokens; the draft's context "
                             f"is {self.draft.context_len}: shorten it")
        scores = score_prompt(self.draft.model, draft_ids, settings.look_ahead, settings.kernel,
                              set(self.draft.tokenizer.eos_token_ids),
                              self.draft.prefill_dtype).scores  # (N,)
        order = rank_chunks(scores, settings.chunk_size)  # (C,)
        hulls = chunk_spans(draft_offsets, chunk_bounds(len(draft_ids), settings.chunk_size))
        return DraftRanking(text, hulls[order], time.perf_counter() - start)


def pick(ranking: DraftRanking, target: Tokenizer, settings: SpeculativeSettings,
         keep_from_char: int | None = None) -> Selection:
    """The target tokens of the best chunks that fit ``settings``' budget, with the always-kept
    ones (see :meth:`DraftSelector.select`)."""
    start, text = time.perf_counter(), ranking.text
    target_ids, target_spans = target.encode_with_offsets(text)
    target_offsets = torch.tensor(target_spans, dtype=torch.int64).view(-1, 2)  # (M, 2)
    check_offsets(target_offsets, len(text), "target model")
    if ranking.skipped:
        return Selection(target_ids, None, len(target_ids), ranking.draft_s,
                         skipped=ranking.skipped)
    forced = _forced_tokens(target, target_ids, target_offsets)
    if keep_from_char is not None:
        forced |= tokens_touching(target_offsets, char_mask(
            torch.tensor([[keep_from_char, len(text)]]), len(text)))
    kept = _fill(ranking.ranked_spans, target_offsets, forced, len(text),
                 settings.budget(len(target_ids)))
    kept_idx = kept.nonzero()[:, 0].tolist()
    return Selection([target_ids[i] for i in kept_idx], POSITIONS[settings.positions](kept_idx),
                     len(target_ids), ranking.draft_s + time.perf_counter() - start)


def _forced_tokens(target: Tokenizer, ids: list[int], offsets: torch.Tensor) -> torch.Tensor:
    """(M,) bool: the target tokens kept whatever the draft says: special tokens (a chat
    template's) and tokens the text does not spell (BOS)."""
    special = {i for i, token in target.inner.get_added_tokens_decoder().items() if token.special}
    is_special = torch.tensor([i in special for i in ids], dtype=torch.bool)
    return is_special | (offsets[:, 1] == offsets[:, 0])


def _fill(ranked_hulls: torch.Tensor, target_offsets: torch.Tensor, forced: torch.Tensor,
          text_len: int, budget: int) -> torch.Tensor:
    """ranked_hulls (C, 2) character spans of the draft's chunks, best first (the first two are
    always kept) -> (M,) bool: the target tokens of the longest prefix of the ranking whose
    tokens fit ``budget`` (binary search: the count only grows with the prefix)."""
    def kept(num_chunks: int) -> torch.Tensor:
        chars = char_mask(ranked_hulls[:num_chunks], text_len)
        return forced | tokens_touching(target_offsets, chars)

    low, high = min(2, len(ranked_hulls)), len(ranked_hulls)
    while low < high:  # largest n in [low, high] with count(n) <= budget, or low
        mid = (low + high + 1) // 2
        if int(kept(mid).sum()) <= budget:
            low = mid
        else:
            high = mid - 1
    return kept(low)
