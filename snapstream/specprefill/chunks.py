"""Prompt chunks ranked by the draft's token scores."""

from __future__ import annotations

import math

import torch


def chunk_bounds(num_tokens: int, chunk_size: int) -> torch.Tensor:
    """(C, 2) [start, end) token indices of consecutive chunks; the last may be shorter."""
    starts = torch.arange(0, num_tokens, chunk_size)  # (C,)
    return torch.stack((starts, (starts + chunk_size).clamp(max=num_tokens)), dim=1)


def rank_chunks(scores: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """scores (P,) -> chunk indices (C,), best first: the first and the last chunk lead (they
    are always kept), the rest by their tokens' mean score (ties: earlier chunk first)."""
    num_tokens = scores.shape[0]
    num_chunks = math.ceil(num_tokens / chunk_size)
    padded = torch.nn.functional.pad(scores.float(), (0, num_chunks * chunk_size - num_tokens))
    sizes = chunk_bounds(num_tokens, chunk_size).diff(dim=1)[:, 0]  # (C,)
    means = padded.view(num_chunks, chunk_size).sum(dim=1) / sizes  # (C,)
    means[0] = means[-1] = math.inf
    return torch.sort(means, descending=True, stable=True).indices
