"""Assemble a prompt of a given number of tokens: needles at their depths in filler, the
question before or after the context, the answer cue at the end.

The length fitter varies only the number of filler characters (same window start, cut at a
word end) and tokenizes the whole rendered prompt until it holds between ``context_len -
LENGTH_SLACK`` and ``context_len`` tokens. Depth: a needle goes to the filler boundary
(sentence start, or either end) nearest to ``depth * len(filler)``; needles at one boundary
keep their depth order.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from evaldata.filler import MAX_WINDOW_CHARS, Filler, FillerWindow, corpus
from evaldata.prompt import PromptParts, TokenizerLike, render
from evaldata.sample import LENGTH_SLACK, Needle, Sample, TaskConfig

MAX_FIT_STEPS = 32
FIRST_CHARS_PER_TOKEN = 4.0


@dataclass(frozen=True)
class Insert:
    """A needle to place: its text and its relative depth in the filler."""

    text: str
    depth: float
    is_target: bool = False


def _prose() -> Filler:
    return corpus("prose")


@dataclass(frozen=True)
class Draft:
    """What a task draws: everything of a sample but the filler's length, and what it is cut
    from (``filler``); ``scoring`` names the sample's scorer (evaldata.scoring.SCORERS)."""

    intro: str
    inserts: tuple[Insert, ...]
    question: str
    cue: str
    answers: tuple[str, ...]
    filler: Filler = field(default_factory=_prose)
    scoring: str = "values"


@dataclass(frozen=True)
class PromptSpec:
    """The tokenizer that measures prompts and the prompt format (prompt.PROMPT_FORMATS)."""

    tokenizer: TokenizerLike
    prompt_format: str = "raw"

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))


def build_sample(task: str, draft: Draft, rng: random.Random, cfg: TaskConfig,
                 spec: PromptSpec) -> Sample:
    """Lay out ``draft`` in filler drawn from ``rng``, fitted to ``cfg.context_len`` tokens."""
    source = draft.filler
    start = source.draw_start(rng)

    def parts_for(num_chars: int) -> tuple[PromptParts, list[int]]:
        context, offsets = _insert(source.window(start, num_chars), draft.inserts)
        parts = PromptParts(intro=draft.intro, context=context, question=draft.question,
                            cue=draft.cue, placement=cfg.placement)
        return parts, offsets

    def count(num_chars: int) -> int:
        return spec.count(render(spec.prompt_format, spec.tokenizer, parts_for(num_chars)[0]))

    num_chars, num_tokens = _fit(count, cfg.context_len, task)
    parts, offsets = parts_for(num_chars)
    prompt = render(spec.prompt_format, spec.tokenizer, parts)
    context_offset = prompt.index(parts.context)
    needles = tuple(sorted(
        (Needle(insert.text, context_offset + offset, insert.is_target)
         for insert, offset in zip(draft.inserts, offsets, strict=True)),
        key=lambda needle: needle.offset))
    return Sample(task=task, prompt=prompt, answers=draft.answers, question=draft.question,
                  cue=draft.cue, context_len=cfg.context_len, depth=cfg.depth,
                  placement=cfg.placement, needles=needles, num_tokens=num_tokens,
                  body=parts.body, scoring=draft.scoring)


def _fit(count: Callable[[int], int], target: int, task: str) -> tuple[int, int]:
    """The number of filler characters whose prompt holds ``target - LENGTH_SLACK`` to
    ``target`` tokens, and that token count: secant steps, bisection where they overshoot."""
    low_tokens = count(0)
    if low_tokens > target - LENGTH_SLACK:
        raise ValueError(f"context_len={target} is too small for {task}: the prompt without "
                         f"filler already takes {low_tokens} tokens")
    low, high = 0, MAX_WINDOW_CHARS  # characters known too few / an upper bound
    goal = target - LENGTH_SLACK // 2
    chars = round((goal - low_tokens) * FIRST_CHARS_PER_TOKEN)
    for _ in range(MAX_FIT_STEPS):
        chars = min(max(chars, low + 1), high - 1) if high - low > 1 else low
        tokens = count(chars)
        if target - LENGTH_SLACK <= tokens <= target:
            return chars, tokens
        low, high = (chars, high) if tokens < target - LENGTH_SLACK else (low, chars)
        rate = (tokens - low_tokens) / chars if chars else 0.0
        secant = chars + (goal - tokens) / rate if rate > 0 else (low + high) // 2
        chars = round(secant) if low < secant < high else (low + high) // 2
    raise ValueError(f"context_len={target}: no filler length fits {task} to within "
                     f"{LENGTH_SLACK} tokens")


def _insert(window: FillerWindow, inserts: Sequence[Insert]) -> tuple[str, list[int]]:
    """The filler with every insert joined by the window's joiner; returns it and each
    insert's offset."""
    slots = [_nearest(window.boundaries, insert.depth * len(window.text)) for insert in inserts]
    order = sorted(range(len(inserts)), key=lambda i: (slots[i], inserts[i].depth, i))
    pieces: list[str] = []
    offsets = [0] * len(inserts)
    cursor = written = 0
    for i in order:
        filler = window.text[cursor : slots[i]]
        cursor = slots[i]
        at_end = cursor == len(window.text) and cursor > 0
        joiner = window.joiner
        piece = joiner + inserts[i].text if at_end else inserts[i].text + joiner
        offsets[i] = written + len(filler) + (len(joiner) if at_end else 0)
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
