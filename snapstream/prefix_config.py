"""How a prefill worker compresses reusable documents (torch-free: the CLI reads it)."""

from __future__ import annotations

from dataclasses import dataclass

SCORES = ("sentence", "surprisal", "repeat")  # snapstream.prefix_scores.SCORERS, the default first
STORES = ("whole", "superset")  # what a stored document holds, the default first


@dataclass(frozen=True)
class DocumentCacheConfig:
    """How a prefill worker stores a reusable document (``--prefix-store``, ``--prefix-score``,
    ``--prefix-superset``). ``store``: ``whole`` (the default) stores every token, and each
    question is prefilled over all of them (as a full prefill would be: a stored subset changed
    the question's own keys and values, and its answers: docs/accuracy.md); ``superset``
    stores the document's *superset* alone (a smaller blob; every question over it): the
    sinks, ``superset`` picks per pick of a request's layout by the question-agnostic scorer
    ``score``, and the document's end."""

    score: str = "sentence"
    superset: int = 3
    store: str = "whole"

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"--prefix-score must be one of {list(SCORES)}, "
                             f"got {self.score!r}")
        if self.superset < 1:
            raise ValueError(f"--prefix-superset must be >= 1, got {self.superset}")
        if self.store not in STORES:
            raise ValueError(f"--prefix-store must be one of {list(STORES)}, "
                             f"got {self.store!r}")


DEFAULT_DOCUMENT_CACHE = DocumentCacheConfig()
