"""What a retrieval task is asked to build (``TaskConfig``) and what it returns (``Sample``).

Lengths are in tokens of the model's tokenizer: a sample's whole prompt (chat template and
answer cue included) holds between ``context_len - LENGTH_SLACK`` and ``context_len`` tokens.
Every prompt ends with the task's answer cue (``The pass key is``); the model's continuation is
scored by the scorer the sample names (``scoring``, one of :data:`evaldata.scoring.SCORERS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from evaldata.scoring import exact_match

LENGTH_SLACK = 16
MIN_CONTEXT_LEN = 128
MAX_DISTRACTORS = 16
MAX_HOPS = 8
MAX_VALUES = 8


class Placement(StrEnum):
    """Where the question goes: after the context (inside SnapKV's observation window) or
    before it (the compression cannot see it; the answer cue then names no key either)."""

    AFTER = "after"
    BEFORE = "before"


@dataclass(frozen=True)
class TaskConfig:
    """One sample's shape. ``depth`` in [0, 1] is the target needle's relative position in the
    filler. ``num_distractors`` counts distractor keys (multikey), extra rows (kv) or distractor
    chains (vartrack); ``num_hops`` the copies of a vartrack chain; ``num_values`` the values of
    the multivalue key. ``placement`` accepts its string value."""

    context_len: int
    depth: float = 0.5
    placement: Placement = Placement.AFTER
    num_distractors: int = 3
    num_hops: int = 2
    num_values: int = 3

    def __post_init__(self) -> None:
        allowed = tuple(p.value for p in Placement)
        if self.placement not in allowed:
            raise ValueError(f"placement must be one of {', '.join(allowed)}, "
                             f"got {self.placement!r}")
        object.__setattr__(self, "placement", Placement(self.placement))
        if self.context_len < MIN_CONTEXT_LEN:
            raise ValueError(f"context_len must be at least {MIN_CONTEXT_LEN} tokens, "
                             f"got {self.context_len}")
        if not 0.0 <= self.depth <= 1.0:
            raise ValueError(f"depth must lie in [0, 1], got {self.depth}")
        for name, low, high in (("num_distractors", 0, MAX_DISTRACTORS),
                                ("num_hops", 1, MAX_HOPS), ("num_values", 1, MAX_VALUES)):
            if not low <= getattr(self, name) <= high:
                raise ValueError(f"{name} must lie in [{low}, {high}], got {getattr(self, name)}")


@dataclass(frozen=True)
class Needle:
    """A statement inserted into the filler; ``offset`` is its first character in the prompt.
    ``is_target``: the answer needs it (it holds an answer, or links the asked vartrack chain).
    """

    text: str
    offset: int
    is_target: bool


@dataclass(frozen=True)
class Sample:
    """One prompt and its answers. ``prompt`` ends with ``cue``; ``question`` and ``body``
    appear verbatim in it; ``num_tokens`` counts the prompt's tokens; ``needles`` are in prompt
    order."""

    task: str
    prompt: str
    answers: tuple[str, ...]
    question: str
    cue: str
    context_len: int
    depth: float
    placement: Placement
    needles: tuple[Needle, ...]
    num_tokens: int
    body: str  # the request's one message (intro, context, question) the prompt renders
    scoring: str = "values"  # the scorer of its generations (evaldata.scoring.SCORERS)

    @property
    def answer(self) -> str:
        return ", ".join(self.answers)

    def is_correct(self, generated: str) -> bool:
        """The final verdict of the sample's scorer on a whole generation."""
        return exact_match(self.answers, generated, self.scoring)

