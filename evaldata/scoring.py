"""How a generation is scored, looked up by name in ``SCORERS``; every scorer takes the
sample's answers, the text generated so far and whether it is final, and returns True or False
once the text decides, None while it cannot tell yet (a word may still grow).

- ``values`` (:func:`verdict`): the first ``len(answers)`` value-shaped words (runs of letters
  and digits that hold a digit; every answer does) are exactly the answers, in any order;
- ``all_values``: every answer appears among the value-shaped words, whatever else is there;
- ``name``: the answer (a Python identifier) appears as a whole identifier, normalized: a
  dotted prefix (``json.decoder.scanstring``), backticks, quotes and call parentheses are
  dropped; case counts.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Scorer = Callable[[tuple[str, ...], str, bool], "bool | None"]

_VALUE = re.compile(r"[0-9A-Za-z]+")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def _complete(pattern: re.Pattern, generated: str, is_final: bool) -> list[str]:
    """The matches of ``pattern`` that cannot grow any more (all of them once final)."""
    return [m.group() for m in pattern.finditer(generated)
            if is_final or m.end() < len(generated)]


def verdict(answers: tuple[str, ...], generated: str, is_final: bool) -> bool | None:
    """Exact match of the first ``len(answers)`` value-shaped words of ``generated`` with
    ``answers`` (as a set)."""
    values = [w for w in _complete(_VALUE, generated, is_final)
              if any(c.isdigit() for c in w)][: len(answers)]
    if len(set(values)) < len(values) or not set(values) <= set(answers):
        return False
    if len(values) == len(answers):
        return True
    return False if is_final else None


def all_values(answers: tuple[str, ...], generated: str, is_final: bool) -> bool | None:
    """Every answer among the value-shaped words of ``generated``."""
    if set(answers) <= set(_complete(_VALUE, generated, is_final)):
        return True
    return False if is_final else None


def name_match(answers: tuple[str, ...], generated: str, is_final: bool) -> bool | None:
    """An answer among the identifiers of ``generated``, each less its dotted prefix."""
    names = {word.rsplit(".", 1)[-1] for word in _complete(_IDENTIFIER, generated, is_final)}
    if names & set(answers):
        return True
    return False if is_final else None


SCORERS: dict[str, Scorer] = {"values": verdict, "all_values": all_values, "name": name_match}


def score(scoring: str, answers: tuple[str, ...], generated: str,
          is_final: bool) -> bool | None:
    """``generated`` scored by the scorer named ``scoring``."""
    if scoring not in SCORERS:
        raise ValueError(f"scoring must be one of {', '.join(SCORERS)}, got {scoring!r}")
    return SCORERS[scoring](answers, generated, is_final)


def exact_match(answers: tuple[str, ...], generated: str, scoring: str = "values") -> bool:
    """The final verdict on a whole generation."""
    return bool(score(scoring, answers, generated, is_final=True))
