"""Assemble a prompt: filler of the right length, needles at their depths, the question placed
before or after the context, the answer cue at the end.

Length: each needle costs its length plus one joining space wherever it lands, so the filler
budget is exact and only the cut of the filler at a word end loses bytes (at most
``LENGTH_SLACK``). Depth: a needle goes to the filler boundary (sentence start, or either end)
nearest to ``depth * len(filler)``; needles at one boundary keep their depth order.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from snapstream.data.filler import FillerWindow, filler_corpus
from snapstream.data.sample import ANSWER_CUE, Needle, Placement, Sample, TaskConfig

MIN_FILLER_LEN = 64


@dataclass(frozen=True)
class Insert:
    """A needle to place: its text and its relative depth in the filler."""

    text: str
    depth: float
    is_target: bool = False


def _after(question: str, context: str) -> tuple[str, int]:
    return f"{context}\n\n{question}{ANSWER_CUE}", 0


def _before(question: str, context: str) -> tuple[str, int]:
    return f"{question}\n\n{context}\n{ANSWER_CUE}", len(question) + 2


RENDERERS: dict[Placement, Callable[[str, str], tuple[str, int]]] = {
    Placement.AFTER: _after,
    Placement.BEFORE: _before,
}


def build_sample(
    *, task: str, rng: random.Random, cfg: TaskConfig, inserts: Sequence[Insert],
    question: str, answer: str, followups: Sequence[tuple[str, str]] = (),
) -> Sample:
    """Lay out ``inserts`` in filler drawn from ``rng`` and wrap them with ``question``.
    The first target insert whose text contains ``answer`` holds it (once). ``followups`` ask
    about the other inserts; they follow the answer in training, never in the prompt."""
    render = RENDERERS[cfg.placement]
    fixed_len = _fixed_len(render, question, [insert.text for insert in inserts])
    filler_len = cfg.context_len - fixed_len
    if filler_len < MIN_FILLER_LEN:
        raise ValueError(
            f"context_len={cfg.context_len} is too small for {task}: question and needles take "
            f"{fixed_len} bytes, leaving less than {MIN_FILLER_LEN} bytes of filler"
        )
    window = filler_corpus(cfg.split).window(rng, filler_len)
    context, offsets = _insert(window, inserts)
    prompt, context_offset = render(question, context)
    needles = tuple(
        Needle(text=insert.text, offset=context_offset + offset, is_target=insert.is_target)
        for insert, offset in sorted(zip(inserts, offsets, strict=True), key=lambda p: p[1])
    )
    target = next(needle for needle in needles if needle.is_target and answer in needle.text)
    return Sample(
        task=task, prompt=prompt, answer=answer, question=question,
        context_len=cfg.context_len, depth=cfg.depth, placement=cfg.placement, split=cfg.split,
        needles=needles, answer_offset=target.offset + target.text.index(answer),
        followups=tuple(followups),
    )


def context_len_for(question: str, needles: Sequence[str]) -> int:
    """The shortest context_len at which ``question`` and ``needles`` fit in either placement
    with the filler build_sample requires."""
    fixed_len = max(_fixed_len(render, question, needles) for render in RENDERERS.values())
    return fixed_len + MIN_FILLER_LEN


def _fixed_len(render: Callable[[str, str], tuple[str, int]], question: str,
               needles: Sequence[str]) -> int:
    """Bytes of a prompt that are not filler: the question, the cue and each needle with the
    space that joins it to the filler."""
    return len(render(question, "")[0]) + sum(len(text) + 1 for text in needles)


def _insert(window: FillerWindow, inserts: Sequence[Insert]) -> tuple[str, list[int]]:
    """The filler with every insert joined by one space; returns it and each insert's offset."""
    slots = [_nearest(window.boundaries, insert.depth * len(window.text)) for insert in inserts]
    order = sorted(range(len(inserts)), key=lambda i: (slots[i], inserts[i].depth, i))
    pieces: list[str] = []
    offsets = [0] * len(inserts)
    cursor = written = 0
    for i in order:
        filler = window.text[cursor : slots[i]]
        cursor = slots[i]
        at_end = cursor == len(window.text)
        piece = f" {inserts[i].text}" if at_end else f"{inserts[i].text} "
        offsets[i] = written + len(filler) + int(at_end)
        pieces += [filler, piece]
        written += len(filler) + len(piece)
    pieces.append(window.text[cursor:])
    return "".join(pieces), offsets


def _nearest(boundaries: tuple[int, ...], position: float) -> int:
    """The boundary closest to ``position`` (the lower one on a tie)."""
    i = bisect_left(boundaries, position)
    if i == 0:
        return boundaries[0]
    if i == len(boundaries):
        return boundaries[-1]
    lower, upper = boundaries[i - 1], boundaries[i]
    return lower if position - lower <= upper - position else upper
