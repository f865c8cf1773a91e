"""Per-request speculative prefill settings, validated once (torch-free: the router uses them)."""

from __future__ import annotations

from dataclasses import dataclass

from snapstream.config import ModelConfig

# position mode -> what the target's kept tokens are numbered with (see selector.POSITIONS)
POSITION_MODES = ("original", "compact")


@dataclass(frozen=True)
class SpeculativeSettings:
    """How much of a prompt the target prefills and how the draft picks it.

    Exactly one of ``keep`` (a share of the target's prompt tokens, in (0, 1]) and
    ``keep_tokens`` (a count of target tokens) sizes the selection. The first and last chunks
    (and, for chat prompts, the template's special tokens and the final user turn) are kept
    on top of it."""

    keep: float | None = 0.25
    keep_tokens: int | None = None
    chunk_size: int = 32
    look_ahead: int = 8
    positions: str = "original"
    kernel: int = 13  # average pool over the draft's attention, along positions

    def __post_init__(self) -> None:
        if (self.keep is None) == (self.keep_tokens is None):
            raise ValueError("speculative: give exactly one of keep (a share) and keep_tokens")
        if self.keep is not None and not 0.0 < self.keep <= 1.0:
            raise ValueError(f"speculative.keep must be in (0, 1], got {self.keep}")
        if self.keep_tokens is not None and self.keep_tokens < 1:
            raise ValueError(f"speculative.keep_tokens must be >= 1, got {self.keep_tokens}")
        if self.chunk_size < 1:
            raise ValueError(f"speculative.chunk_size must be >= 1, got {self.chunk_size}")
        if self.look_ahead < 0:
            raise ValueError(f"speculative.look_ahead must be >= 0, got {self.look_ahead}")
        if self.positions not in POSITION_MODES:
            raise ValueError(f"speculative.positions must be one of {list(POSITION_MODES)}, "
                             f"got {self.positions!r}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"speculative.kernel must be a positive odd number, "
                             f"got {self.kernel}")

    @classmethod
    def defaults_for(cls, target: ModelConfig) -> SpeculativeSettings:
        """The settings a request's unset fields take with ``target`` as the target model:
        its kept tokens renumbered (``compact``) when it has sliding-window layers (their
        window then holds kept tokens only, not the gaps between them; measured in
        docs/accuracy.md), at their original positions otherwise."""
        return cls(positions="compact" if target.sliding_layers else "original")

    def budget(self, num_target_tokens: int) -> int:
        """Target tokens the ranked chunks may fill (forced spans can exceed it)."""
        if self.keep_tokens is not None:
            return self.keep_tokens
        return max(1, round(self.keep * num_target_tokens))
