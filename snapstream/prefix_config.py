"""How a prefill worker compresses reusable documents (torch-free: the CLI reads it)."""

from __future__ import annotations

from dataclasses import dataclass

SCORES = ("sentence", "surprisal", "repeat")  # snapstream.prefix_scores.SCORERS, the default first


@dataclass(frozen=True)
class DocumentCacheConfig:
    """How a prefill worker compresses a reusable document (``--prefix-score``,
    ``--prefix-superset``): its scorer, and how many picks it stores per pick of a request's
    layout (the question's SnapKV window chooses among them)."""

    score: str = "sentence"
    superset: int = 3

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"--prefix-score must be one of {list(SCORES)}, "
                             f"got {self.score!r}")
        if self.superset < 1:
            raise ValueError(f"--prefix-superset must be >= 1, got {self.superset}")


DEFAULT_DOCUMENT_CACHE = DocumentCacheConfig()
