"""Sampling parameters and a per-row sampler whose randomness depends only on (seed, position).

Keying the random stream on the absolute position (not on a stateful generator) makes a seeded
generation reproducible whatever batch it runs in, and when it is resumed on another worker.
"""

from __future__ import annotations

import torch

from snapstream.sampling_params import MAX_SEED, SamplingParams


def _filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits (V,) float64 -> probabilities (V,) after temperature, top-k and top-p.

    In float64, ``logits / temperature`` stays finite for every temperature a request can carry
    (the proto's float32: down to 1.4e-45, where float32 division overflows to inf and the
    softmax to nan); softmax subtracts the maximum, so a tiny temperature becomes near-greedy.
    """
    logits = logits / params.temperature
    if params.top_k:
        kth = logits.topk(min(params.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        outside = sorted_probs.cumsum(0) - sorted_probs > params.top_p  # keeps the top token
        probs = probs.scatter(0, order, sorted_probs.masked_fill(outside, 0.0))
    return probs


def sample_row(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    """Next token for one sequence; ``position`` is the absolute position it will occupy."""
    if params.is_greedy:
        return int(logits.argmax())
    if params.seed is None:
        raise ValueError("sampling with temperature > 0 needs a seed (the engine assigns one)")
    generator = torch.Generator().manual_seed((params.seed * 1_000_003 + position) % MAX_SEED)
    return int(torch.multinomial(_filtered_probs(logits.double().cpu(), params), 1,
                                 generator=generator))


def sample_batch(
    logits: torch.Tensor, params: list[SamplingParams | None], positions: list[int]
) -> list[int]:
    """logits (B, V) -> one token per row; rows whose params are None (idle) get -1."""
    greedy = logits.argmax(dim=-1).tolist()  # one host sync for every greedy row
    return [
        -1 if p is None else greedy[i] if p.is_greedy else sample_row(logits[i], p, positions[i])
        for i, p in enumerate(params)
    ]
