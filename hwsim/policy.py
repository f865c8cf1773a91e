"""KV-cache policies as the cost model sees them: how many tokens each sequence keeps.

``full`` keeps every token, so the cache grows with the context. ``snapstream`` keeps a fixed
``n_sink + n_topk + n_recent`` slots per layer per KV head whatever the context: the decode
graph is static, so every step reads all slots, even while some are still empty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class PolicyKind(StrEnum):
    FULL = "full"
    SNAPSTREAM = "snapstream"


# Default budget: 32768 slots = 128k / 4, the "4x" of SnapStream at 128k context (docs/hwsim.md).
DEFAULT_N_SINK = 4
DEFAULT_N_TOPK = 16380
DEFAULT_N_RECENT = 16384


@dataclass(frozen=True)
class PolicyConfig:
    kind: PolicyKind = PolicyKind.SNAPSTREAM
    n_sink: int = DEFAULT_N_SINK
    n_topk: int = DEFAULT_N_TOPK
    n_recent: int = DEFAULT_N_RECENT

    def __post_init__(self) -> None:
        if not isinstance(self.kind, PolicyKind):
            raise ValueError(f"policy: expected a PolicyKind, got {self.kind!r}")
        for name in ("n_sink", "n_topk", "n_recent"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.n_recent < 1:
            raise ValueError("n_recent must be >= 1: the ring needs a slot for the newest token")

    @property
    def budget(self) -> int:
        return self.n_sink + self.n_topk + self.n_recent

    def cache_tokens(self, context_len: int) -> int:
        """Tokens each sequence's cache holds (and each decode step reads) at ``context_len``."""
        if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 1:
            raise ValueError(f"context must be an integer >= 1, got {context_len!r}")
        return CACHE_TOKENS[self.kind](self, context_len)


CACHE_TOKENS: dict[PolicyKind, Callable[[PolicyConfig, int], int]] = {
    PolicyKind.FULL: lambda _policy, context_len: context_len,
    PolicyKind.SNAPSTREAM: lambda policy, _context_len: policy.budget,
}

