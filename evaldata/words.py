"""Word-level checks of the paraphrased workloads: content words, a crude stemmer, and when two
words count as the same.

A text's content words are its runs of ASCII letters, lowercased, less ``STOP_WORDS`` (English
function words: articles, pronouns, auxiliaries, prepositions, question words), each reduced by
:func:`stem`. Two words are *related* when their stems are equal, when the shorter stem (of at
least ``MIN_PREFIX`` letters) starts the longer (``pars`` / ``parser``), or when one stem of at
least ``MIN_PREFIX`` letters lies inside an identifier run together (``addr`` in
``getaddrinfo``). The stemmer strips more than a linguist would, so the rule errs towards
calling words related: a check that two texts share no related word is stricter than "no
shared word".
"""

from __future__ import annotations

import re

_STOP_WORDS_TEXT = """
a about above after again against all also am an and any are as at be because been before being
below between both but by can cannot could did do does doing down during each either else ever
every few for from further had has have having he her here hers herself him himself his how i if
in into is it its itself just may me might more most must my myself neither no nor not now of off
on once one only onto or other ought our ours ourselves out over own per same shall she should so
some such than that the their theirs them themselves then there these they this those through
thus to too under until up upon us very via was we were what when where whether which while who
whom whose why will with within without would yet you your yours yourself yourselves
"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())
SUFFIXES = ("ingly", "edly", "ings", "ing", "ers", "ies", "ied", "ed", "es", "er", "ly", "s")
MIN_STEM = 3
MIN_PREFIX = 4

_WORD = re.compile(r"[A-Za-z]+")
_IDENTIFIER_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")


def stem(word: str) -> str:
    """``word`` lowercased, less one inflectional suffix, a final ``e`` or ``y`` folded and a
    doubled final consonant undoubled: ``parses``, ``parsed``, ``parser``, ``parsing`` ->
    ``pars``; ``copies``, ``copy`` -> ``copi``; ``stopped`` -> ``stop``."""
    w = word.lower()
    for suffix in SUFFIXES:
        if w.endswith(suffix) and len(w) - len(suffix) >= MIN_STEM and not w.endswith("ss"):
            w = w[: -len(suffix)] + ("i" if suffix in ("ies", "ied") else "")
            break
    if len(w) > MIN_STEM and w[-1] == "e":
        w = w[:-1]
    elif len(w) > MIN_STEM and w[-1] == "y":
        w = w[:-1] + "i"
    if len(w) > MIN_STEM and w[-1] == w[-2] and w[-1] not in "lsz":
        w = w[:-1]
    return w


def content_words(text: str) -> list[str]:
    """The words of ``text`` that carry content (``STOP_WORDS`` and one-letter words left out),
    as written, in order."""
    return [w for w in _WORD.findall(text) if len(w) > 1 and w.lower() not in STOP_WORDS]


def identifier_words(name: str) -> list[str]:
    """The words of a Python identifier: split at underscores, digits and case changes
    (``getHTTPHeader_v2`` -> ``get``, ``HTTP``, ``Header``, ``v``), stop words kept."""
    return [part for part in _IDENTIFIER_PART.findall(name) if part]


def related(a: str, b: str) -> bool:
    """Whether words ``a`` and ``b`` count as the same word (module docstring)."""
    x, y = sorted((stem(a), stem(b)), key=len)
    return x == y or (len(x) >= MIN_PREFIX and y.startswith(x))


def shared_words(first: str, second: str) -> list[tuple[str, str]]:
    """Every pair of related content words, one from each text."""
    return [(a, b) for a in content_words(first) for b in content_words(second) if related(a, b)]


def name_words_in(text: str, name: str) -> list[str]:
    """The content words of ``text`` related to a word of the identifier ``name``, or whose stem
    (``MIN_PREFIX`` letters or more) lies inside the name run together (``addr`` in
    ``getaddrinfo``)."""
    joined = name.replace("_", "").lower()
    parts = [p for p in identifier_words(name) if p.lower() not in STOP_WORDS]
    return [w for w in content_words(text)
            if any(related(w, p) for p in parts)
            or (len(stem(w)) >= MIN_PREFIX and stem(w) in joined)]
