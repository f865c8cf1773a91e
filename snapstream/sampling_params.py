"""Per-request sampling parameters (torch-free: the router and the client import them)."""

from __future__ import annotations

from dataclasses import dataclass

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
