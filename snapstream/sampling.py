"""Sampling parameters and a per-row sampler whose randomness depends only on (seed, position).

Keying the random stream on the absolute position (not on a stateful generator) makes a seeded
generation reproducible whatever batch it runs in, and when it is resumed on another worker.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be in [0, 2**63-1], got {self.seed}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be >= 0, got {self.stop_token_ids}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def _filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits (V,) float32 -> probabilities (V,) after temperature, top-k and top-p."""
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
    return int(torch.multinomial(_filtered_probs(logits.float().cpu(), params), 1,
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
