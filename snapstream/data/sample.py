"""What a retrieval task is asked to build (``TaskConfig``) and what it returns (``Sample``).

Prompt format (the model is byte level: one token = one UTF-8 byte, and every string here is
ASCII, so character offsets are byte offsets):

- ``placement="after"``:  ``{context}\\n\\n{question}\\nAnswer: ``
- ``placement="before"``: ``{question}\\n\\n{context}\\n\\nAnswer: ``

Every prompt ends with ``ANSWER_CUE``; the model is trained on ``prompt + answer + TERMINATOR``
and a generation is scored by ``exact_match``. Length rule: ``context_len - LENGTH_SLACK <=
len(prompt) <= context_len`` (filler is cut at a word boundary, words are at most
``LENGTH_SLACK`` bytes long).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

ANSWER_CUE = "\nAnswer: "
TERMINATOR = "\n"
LENGTH_SLACK = 16
MIN_CONTEXT_LEN = 128
MAX_ANSWER_LEN = 7
MAX_DISTRACTORS = 16
MAX_HOPS = 8


class Placement(StrEnum):
    """Where the question goes: after the context (inside SnapKV's observation window) or
    before it (the compression cannot see the question)."""

    AFTER = "after"
    BEFORE = "before"


class Split(StrEnum):
    """Which pool of filler text and phrasings to draw from; the two never share a string."""

    TRAIN = "train"
    HELDOUT = "heldout"


def _coerce(enum: type[StrEnum], name: str, value: object) -> StrEnum:
    allowed = tuple(member.value for member in enum)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return enum(value)


@dataclass(frozen=True)
class TaskConfig:
    """One sample's shape. ``depth`` in [0, 1] is the target needle's relative position in the
    filler (0 = before all filler, 1 = after it). ``num_distractors`` counts distractor keys
    (multikey), extra table rows (kv) or distractor chains (vartrack); ``num_hops`` counts the
    copy statements of a vartrack chain. ``placement`` and ``split`` accept their string values.
    """

    context_len: int
    depth: float = 0.5
    placement: Placement = Placement.AFTER
    split: Split = Split.TRAIN
    num_distractors: int = 3
    num_hops: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "placement", _coerce(Placement, "placement", self.placement))
        object.__setattr__(self, "split", _coerce(Split, "split", self.split))
        if self.context_len < MIN_CONTEXT_LEN:
            raise ValueError(
                f"context_len must be at least {MIN_CONTEXT_LEN} bytes, got {self.context_len}"
            )
        if not 0.0 <= self.depth <= 1.0:
            raise ValueError(f"depth must lie in [0, 1], got {self.depth}")
        if not 0 <= self.num_distractors <= MAX_DISTRACTORS:
            raise ValueError(
                f"num_distractors must lie in [0, {MAX_DISTRACTORS}], got {self.num_distractors}"
            )
        if not 1 <= self.num_hops <= MAX_HOPS:
            raise ValueError(f"num_hops must lie in [1, {MAX_HOPS}], got {self.num_hops}")


@dataclass(frozen=True)
class Needle:
    """A statement inserted into the filler; ``offset`` is its first byte in the prompt.
    ``is_target``: the answer needs it (it holds the answer, or links the asked vartrack chain).
    """

    text: str
    offset: int
    is_target: bool


@dataclass(frozen=True)
class Sample:
    """One prompt with its answer. ``prompt[answer_offset:answer_offset + len(answer)] ==
    answer``; ``needles`` are in prompt order; ``question`` appears verbatim in the prompt.
    ``followups``: (question, answer) pairs about the other facts of the context (training)."""

    task: str
    prompt: str
    answer: str
    question: str
    context_len: int
    depth: float
    placement: Placement
    split: Split
    needles: tuple[Needle, ...]
    answer_offset: int
    followups: tuple[tuple[str, str], ...] = ()

    @property
    def target(self) -> str:
        """What the model is trained to generate after the prompt."""
        return self.answer + TERMINATOR

    def training_segments(self) -> tuple[tuple[str, bool], ...]:
        """The training text as ``(text, is_answer)`` pieces: the prompt, the answer, then each
        follow-up question about another fact of the same context, cued and answered like the
        first. Follow-ups multiply the answers a training sequence carries at almost no cost."""
        segments = [(self.prompt, False), (self.target, True)]
        for question, answer in self.followups:
            segments += [(f"{question}{ANSWER_CUE}", False), (answer + TERMINATOR, True)]
        return tuple(segments)


def exact_match(generated: str, answer: str) -> bool:
    """True when the generation up to the first ``TERMINATOR``, stripped, equals ``answer``."""
    return generated.split(TERMINATOR, 1)[0].strip() == answer
