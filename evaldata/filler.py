"""Haystacks, available offline, looked up by name in ``CORPORA``:

- ``prose``: English prose from the docstrings and comments of this interpreter's standard
  library (top-level modules in name order, each sentence kept at its first occurrence, folded
  to ASCII), in document order. It depends on the Python version; ``Corpus.fingerprint``
  identifies it.
- ``classic``: the passkey test's repeated noise ("The grass is green. The sky is blue. ...").

A sample's filler is a window of a corpus that starts at a sentence drawn from the sample's
random generator and ends at a word end; the length fitter (layout.py) then only varies its
length, so every length it tries shows the same text. A window that runs past the corpus's end
goes on from its start (32k tokens of prose are ~160k characters); starts are drawn at least
``START_MARGIN_CHARS`` from the end, as when windows stopped there, so a prompt that fits
before the end is the one it was.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import random
import re
import sysconfig
import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate, chain, groupby
from pathlib import Path
from typing import Protocol

MIN_SENTENCE_LEN = 40
MAX_SENTENCE_LEN = 240
MAX_WORD_LEN = 16
MAX_WINDOW_CHARS = 200_000  # ~32k tokens of prose (Gemma 3: 4.8 characters a token) and more
START_MARGIN_CHARS = 80_000
RESERVED_WORDS = ("answer", "question", "passkey", "pass key", "magic number", "var ", "value",
                  "key", "default")
CLASSIC_NOISE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
                 "There and back again.")

_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_COMMENT = re.compile(r"^[ \t]*#[ \t]?(.*)$")
_PLAIN_WORD = re.compile(r"^[(\"']?[A-Za-z][A-Za-z'-]*[)\"']?[.,;:!?]?[)\"']?$")
_DIGIT = re.compile(r"\d")


@dataclass(frozen=True)
class FillerWindow:
    """A run of filler; ``boundaries`` are the offsets where a needle may go: 0, every
    sentence start (a source file's start in code), and ``len(text)``; ``joiner`` separates a
    needle from the filler around it."""

    text: str
    boundaries: tuple[int, ...]
    joiner: str = " "


class Filler(Protocol):
    """What a sample's filler is cut from: a :class:`Corpus`, or a haystack drawn for one sample
    (evaldata.codebase)."""

    def draw_start(self, rng: random.Random) -> int:
        """Where the sample's windows start, drawn from its generator."""
        ...

    def window(self, start: int, length: int) -> FillerWindow:
        """At most ``length`` (up to ``MAX_WINDOW_CHARS``) characters from ``start``."""
        ...


@dataclass(frozen=True)
class Corpus:
    """Sentences joined by single spaces; ``sentence_starts`` are ascending offsets in ``text``."""

    name: str
    text: str
    sentence_starts: tuple[int, ...]

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.text.encode("ascii")).hexdigest()[:16]

    @functools.cached_property
    def _cycled(self) -> tuple[str, tuple[int, ...]]:
        """The text twice over (one space between) and its sentence starts."""
        again = (len(self.text) + 1 + start for start in self.sentence_starts)
        return f"{self.text} {self.text}", (*self.sentence_starts, *again)

    def draw_start(self, rng: random.Random) -> int:
        """A sentence start with at least ``START_MARGIN_CHARS`` of text after it."""
        last = bisect_right(self.sentence_starts, len(self.text) - START_MARGIN_CHARS) - 1
        if last < 0 or len(self.text) + START_MARGIN_CHARS < MAX_WINDOW_CHARS:
            raise ValueError(f"the {self.name} corpus holds {len(self.text)} characters, fewer "
                             f"than the {MAX_WINDOW_CHARS - START_MARGIN_CHARS} windows need")
        return self.sentence_starts[rng.randrange(last + 1)]

    def window(self, start: int, length: int) -> FillerWindow:
        """At most ``length`` characters from ``start`` (one :meth:`draw_start` gives), cut
        after the last whole word; past the end of the text the window goes on from its start."""
        if not 0 <= length <= MAX_WINDOW_CHARS:
            raise ValueError(f"a filler window holds 0 to {MAX_WINDOW_CHARS} characters, "
                             f"asked for {length}")
        text, sentence_starts = self._cycled
        end = start + length
        if end < len(text) and text[end] != " ":
            end = max(start, text.rfind(" ", start, end))
        first = bisect_left(sentence_starts, start)
        stop = bisect_left(sentence_starts, end)
        inner = (offset - start for offset in sentence_starts[first:stop])
        boundaries = (*sorted({0, *inner}), end - start)
        return FillerWindow(text=text[start:end], boundaries=tuple(sorted(set(boundaries))))


def _joined(name: str, sentences: tuple[str, ...]) -> Corpus:
    starts = accumulate((len(sentence) + 1 for sentence in sentences[:-1]), initial=0)
    return Corpus(name=name, text=" ".join(sentences), sentence_starts=tuple(starts))


def _prose() -> Corpus:
    seen: dict[str, None] = {}
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        seen.update(dict.fromkeys(_module_sentences(path)))
    return _joined("prose", tuple(seen))


def _classic() -> Corpus:
    sentences = tuple(_SENTENCE_BREAK.split(CLASSIC_NOISE))
    repeats = 2 * START_MARGIN_CHARS // len(CLASSIC_NOISE) + 1
    return _joined("classic", sentences * repeats)


CORPORA: dict[str, Callable[[], Corpus]] = {"prose": _prose, "classic": _classic}


@functools.cache
def corpus(name: str) -> Corpus:
    """A corpus by name, built once per process."""
    if name not in CORPORA:
        raise ValueError(f"corpus must be one of {', '.join(CORPORA)}, got {name!r}")
    return CORPORA[name]()


def _module_sentences(path: Path) -> Iterator[str]:
    source = path.read_text(encoding="utf-8", errors="replace")
    for paragraph in chain(_docstrings(source), _comment_blocks(source)):
        ascii_text = unicodedata.normalize("NFKD", paragraph).encode("ascii", "ignore").decode()
        yield from filter(is_prose, _SENTENCE_BREAK.split(" ".join(ascii_text.split())))


def _docstrings(source: str) -> Iterator[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, _DOCUMENTED) and (doc := ast.get_docstring(node)):
            yield from _PARAGRAPH_BREAK.split(doc)


def _comment_blocks(source: str) -> Iterator[str]:
    matches = (_COMMENT.match(line) for line in source.splitlines())
    for is_comment, block in groupby(matches, key=bool):
        if is_comment:
            yield "\n".join(match.group(1) for match in block)


def is_prose(sentence: str) -> bool:
    """A filler sentence: ASCII prose of moderate length with short, plain words, no digits
    (scoring reads words with digits as answers) and none of the words the tasks use."""
    words = sentence.split()
    return (
        MIN_SENTENCE_LEN <= len(sentence) <= MAX_SENTENCE_LEN
        and sentence.isascii()
        and sentence.isprintable()
        and sentence[0].isupper()
        and sentence[-1] in ".!?"
        and max(map(len, words)) <= MAX_WORD_LEN
        and not _DIGIT.search(sentence)
        and not any(word in sentence.lower() for word in RESERVED_WORDS)
        and sum(bool(_PLAIN_WORD.match(word)) for word in words) >= 0.9 * len(words)
    )
