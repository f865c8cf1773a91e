"""Filler text: English prose from the docstrings and comments of this interpreter's standard
library (top-level modules, sorted by name), folded to ASCII and split into sentences.

Each module goes to the held-out corpus when the CRC-32 of its name is divisible by
``HELDOUT_MODULUS``, to the train corpus otherwise; a sentence is kept only at its first
occurrence, so the two corpora share no sentence. The corpus depends on the Python version;
``FillerCorpus.fingerprint`` identifies it.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import random
import re
import sysconfig
import unicodedata
import zlib
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate, chain, groupby
from pathlib import Path

from snapstream.data.sample import LENGTH_SLACK, Split

HELDOUT_MODULUS = 5
MIN_SENTENCE_LEN = 40
MAX_SENTENCE_LEN = 240
MAX_WORD_LEN = LENGTH_SLACK
RESERVED_WORDS = ("answer", "question", "passkey", "pass key", "var ", "->", "lookup", "table")

_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_COMMENT = re.compile(r"^[ \t]*#[ \t]?(.*)$")
_PLAIN_WORD = re.compile(r"^[(\"']?[A-Za-z][A-Za-z'-]*[)\"']?[.,;:!?]?[)\"']?$")
_LONG_NUMBER = re.compile(r"\d{4}")


@dataclass(frozen=True)
class FillerWindow:
    """A run of filler; ``boundaries`` are the offsets where a needle may go: 0, every
    sentence start, and ``len(text)``."""

    text: str
    boundaries: tuple[int, ...]


@dataclass(frozen=True)
class FillerCorpus:
    """Sentences joined by single spaces; ``sentence_starts`` are ascending offsets in ``text``."""

    split: Split
    text: str
    sentence_starts: tuple[int, ...]

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.text.encode("ascii")).hexdigest()[:16]

    def window(self, rng: random.Random, length: int) -> FillerWindow:
        """A window of at most ``length`` bytes and at least ``length - MAX_WORD_LEN``: it ends
        at a sentence end drawn from ``rng`` and starts at a word start."""
        if length > len(self.text):
            raise ValueError(
                f"context_len asks for {length} bytes of filler; the {self.split} corpus "
                f"holds only {len(self.text)}"
            )
        first_fitting = bisect_left(self.sentence_starts, length + 1) - 1
        end = self._sentence_end(rng.randrange(first_fitting, len(self.sentence_starts)))
        start = end - length
        if start > 0 and self.text[start - 1] != " ":
            start = self.text.index(" ", start) + 1
        first = bisect_left(self.sentence_starts, start)
        stop = bisect_left(self.sentence_starts, end)
        inner = (offset - start for offset in self.sentence_starts[first:stop])
        boundaries = (*sorted({0, *inner}), end - start)
        return FillerWindow(text=self.text[start:end], boundaries=boundaries)

    def _sentence_end(self, index: int) -> int:
        is_last = index + 1 == len(self.sentence_starts)
        return len(self.text) if is_last else self.sentence_starts[index + 1] - 1


@functools.cache
def filler_corpus(split: Split) -> FillerCorpus:
    """The corpus of one split, extracted once per process."""
    sentences = _sentences_by_split()[Split(split)]
    starts = accumulate((len(sentence) + 1 for sentence in sentences[:-1]), initial=0)
    return FillerCorpus(split=Split(split), text=" ".join(sentences), sentence_starts=tuple(starts))


@functools.cache
def _sentences_by_split() -> dict[Split, tuple[str, ...]]:
    seen: set[str] = set()
    by_split: dict[Split, list[str]] = {split: [] for split in Split}
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        kept = by_split[module_split(path.stem)]
        for sentence in _module_sentences(path):
            if sentence not in seen:
                seen.add(sentence)
                kept.append(sentence)
    return {split: tuple(sentences) for split, sentences in by_split.items()}


def module_split(module_name: str) -> Split:
    """The split every sentence of a standard-library module belongs to."""
    is_heldout = zlib.crc32(module_name.encode()) % HELDOUT_MODULUS == 0
    return Split.HELDOUT if is_heldout else Split.TRAIN


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
    """A filler sentence: ASCII prose of moderate length with short, plain words, no long
    numbers (they would read as passkeys) and none of the words the tasks' phrasings use."""
    words = sentence.split()
    return (
        MIN_SENTENCE_LEN <= len(sentence) <= MAX_SENTENCE_LEN
        and sentence.isascii()
        and sentence.isprintable()
        and sentence[0].isupper()
        and sentence[-1] in ".!?"
        and max(map(len, words)) <= MAX_WORD_LEN
        and not _LONG_NUMBER.search(sentence)
        and not any(word in sentence.lower() for word in RESERVED_WORDS)
        and sum(bool(_PLAIN_WORD.match(word)) for word in words) >= 0.9 * len(words)
    )
