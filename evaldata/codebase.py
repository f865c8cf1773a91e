"""Code-search haystacks: parts of real source files under ``# file: <path>`` headers, the
asked function's among them at its depth.

Every block is a file's run of consecutive top-level statements (with the lines between them),
the whole file when it fits: from a first statement, statements are added alternately after and
before the run while the block stays within its character limit. A filler block starts at a
statement drawn from the sample's generator (skipped when that statement alone does not fit);
the target's block starts at the asked function and names it once. Blocks hold at most
``MAX_BLOCK_CHARS`` characters, or half the context's length in tokens at a short context (a
token spells at least one character), so that the depth a block is placed at is fine enough.

Targets (:func:`targets`): candidate functions (:mod:`evaldata.sources`) with a description
(:mod:`evaldata.describe`), a name of at least ``MIN_NAME_LEN`` characters not made of stop
words alone (``is_not`` would match prose), that the task's fixed texts (intro, question, cue)
do not name, and a docstring whose first sentence no other candidate shares.

The filler (:func:`haystack`) is blocks of the target repository's other files, then of every
other repository's, each order drawn from the sample's generator, less the blocks that name the
function or hold its docstring's first sentence, until ``MAX_WINDOW_CHARS`` characters; its
windows all start at its beginning and end at a space or line end when one lies within
``MAX_CUT_BACK`` characters of their length, else exactly there (a long run without a space,
one token a character for a byte-level tokenizer, would leave no length that fits). So the
answer, the function's name, occurs in the context exactly once: in its ``def``.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

from evaldata.describe import describe, first_sentence
from evaldata.filler import MAX_WINDOW_CHARS, FillerWindow
from evaldata.sources import Function, SourceFile, mentions, repositories
from evaldata.sources import functions as candidate_functions
from evaldata.words import STOP_WORDS, identifier_words

HEADER = "# file: {path}\n"
MAX_CUT_BACK = 8  # a window ends at a space or line end this close to its length, else there
JOINER = "\n\n"  # between blocks
MAX_BLOCK_CHARS = 6_000
MIN_NAME_LEN = 4


@dataclass(frozen=True)
class Target:
    function: Function
    description: str

    @property
    def name(self) -> str:
        return self.function.name


@functools.cache
def targets(fixed_text: str) -> tuple[Target, ...]:
    """Every function code search may ask for, given the task's ``fixed_text`` (the intro,
    question and cue templates joined), in repository and file order."""
    found = [Target(fn, text) for fn in candidate_functions()
             if (text := describe(fn.docstring, fn.name)) is not None
             and len(fn.name) >= MIN_NAME_LEN and not mentions(fixed_text, fn.name)
             and any(w.lower() not in STOP_WORDS for w in identifier_words(fn.name))]
    counts = Counter(first_sentence(t.function.docstring) for t in found)
    return tuple(t for t in found if counts[first_sentence(t.function.docstring)] == 1)


def block(file: SourceFile, first: int, max_chars: int,
          fits: Callable[[str], bool] = lambda text: True) -> str | None:
    """The header and the statements grown from ``first`` (module docstring) while the block
    holds at most ``max_chars`` characters and ``fits``; None when statement ``first`` alone
    does not."""

    def text(lo: int, hi: int) -> str:
        return HEADER.format(path=file.path) + file.part(lo, hi).rstrip()

    low = high = first
    if len(text(low, high)) > max_chars or not fits(text(low, high)):
        return None
    can_grow = {1: True, -1: True}
    while any(can_grow.values()):
        for step in (1, -1):
            lo, hi = (low, high + 1) if step == 1 else (low - 1, high)
            if can_grow[step] and lo >= 0 and hi < len(file.statements):
                grown = text(lo, hi)
                if len(grown) <= max_chars and fits(grown):
                    low, high = lo, hi
                    continue
            can_grow[step] = False
    return text(low, high)


def target_block(target: Target, max_chars: int) -> str | None:
    """The target's block: None when its function alone exceeds ``max_chars``."""
    fn = target.function
    return block(fn.file, fn.statement, max_chars, lambda text: mentions(text, fn.name) == 1)


@dataclass(frozen=True)
class CodeHaystack:
    """Files under their headers, joined by ``JOINER``; ``file_starts``: each header's offset."""

    text: str
    file_starts: tuple[int, ...]

    def draw_start(self, rng: random.Random) -> int:
        return 0

    def window(self, start: int, length: int) -> FillerWindow:
        if not 0 <= length <= MAX_WINDOW_CHARS:
            raise ValueError(f"a filler window holds 0 to {MAX_WINDOW_CHARS} characters, "
                             f"asked for {length}")
        end = min(start + length, len(self.text))
        if end < len(self.text) and not self.text[end].isspace():
            space = max(self.text.rfind(" ", start, end), self.text.rfind("\n", start, end))
            end = space if space >= max(start, end - MAX_CUT_BACK) else end
        inner = (offset - start for offset in self.file_starts if start < offset < end)
        return FillerWindow(text=self.text[start:end], boundaries=(0, *inner, end - start),
                            joiner=JOINER)


def haystack(rng: random.Random, target: Target, max_chars: int) -> CodeHaystack:
    """The filler for ``target`` (module docstring) in blocks of at most ``max_chars``
    characters, drawn from ``rng``."""
    repos = repositories()
    own = [f for f in repos[target.function.file.repo] if f != target.function.file]
    others = [f for repo, files in repos.items() if repo != target.function.file.repo
              for f in files]
    rng.shuffle(own)
    rng.shuffle(others)
    sentence = first_sentence(target.function.docstring)
    blocks: list[str] = []
    size = 0
    for file in chain(own, others):
        if size >= MAX_WINDOW_CHARS:
            break
        first = rng.randrange(len(file.statements))
        text = block(file, first, max_chars)
        if text is None or mentions(text, target.name) or sentence in text:
            continue
        blocks.append(text)
        size += len(text) + len(JOINER)
    starts = [0]
    for text in blocks[:-1]:
        starts.append(starts[-1] + len(text) + len(JOINER))
    return CodeHaystack(text=JOINER.join(blocks), file_starts=tuple(starts))
