"""How a prefill worker compresses reusable documents (torch-free: the CLI reads it)."""

from __future__ import annotations

from dataclasses import dataclass

SCORES = ("sentence", "surprisal", "repeat")  # snapstream.prefix_scores.SCORERS, the default first
WHOLE = 0  # ``superset``: the whole document is stored, nothing scored


@dataclass(frozen=True)
class DocumentCacheConfig:
    """How a prefill worker stores a reusable document (``--prefix-superset``,
    ``--prefix-score``): ``superset`` picks per pick of a request's layout (the question's
    SnapKV window chooses among them), chosen by the scorer ``score``; ``WHOLE`` (0, the
    default): every document token, the question prefilled over the whole document as a full
    prefill would be (a stored subset changed the question's own keys and values:
    docs/accuracy.md)."""

    score: str = "sentence"
    superset: int = WHOLE

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"--prefix-score must be one of {list(SCORES)}, "
                             f"got {self.score!r}")
        if self.superset < 0:
            raise ValueError(f"--prefix-superset must be >= 0 (0: the whole document), "
                             f"got {self.superset}")


DEFAULT_DOCUMENT_CACHE = DocumentCacheConfig()
