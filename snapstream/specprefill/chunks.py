"""Prompt chunks ranked by the draft's token scores."""

from __future__ import annotations

import math

import torch


def chunk_bounds(num_tokens: int, chunk_size: int, start: int = 0,
                 end: int | None = None) -> torch.Tensor:
    """(C, 2) [start, end) token indices: consecutive chunks of ``chunk_size`` over the tokens
    [start, end) (the last may be shorter), and the tokens before ``start`` and after ``end``
    (a template's, that no chunk of the text should share), if any, one chunk each."""
    end = num_tokens if end is None else end
    starts = torch.arange(start, end, chunk_size)  # (C,)
    text = torch.stack((starts, (starts + chunk_size).clamp(max=end)), dim=1)
    head = torch.tensor([[0, start]] if start > 0 else [], dtype=torch.int64).view(-1, 2)
    tail = torch.tensor([[end, num_tokens]] if end < num_tokens else [],
                        dtype=torch.int64).view(-1, 2)
    return torch.cat((head, text, tail))


def rank_chunks(scores: torch.Tensor, bounds: torch.Tensor, always: tuple[int, int]
                ) -> torch.Tensor:
    """scores (P,), bounds (C, 2) -> chunk indices (C,), best first: the two ``always`` chunks
    lead (the text's first and last, always kept), the rest by their tokens' mean score (ties:
    earlier chunk first)."""
    sums = torch.nn.functional.pad(scores.double().cumsum(0), (1, 0))  # (P + 1,)
    means = (sums[bounds[:, 1]] - sums[bounds[:, 0]]) / bounds.diff(dim=1)[:, 0]  # (C,)
    means[list(always)] = math.inf
    return torch.sort(means, descending=True, stable=True).indices
