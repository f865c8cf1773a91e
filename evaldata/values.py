"""Random needle contents: short, ASCII and of fixed shapes, so answers are exact-match checkable.

- ``number``: 5 to 7 digits, no leading zero (passkeys, multikey and vartrack values);
- ``label``: ``adjective-noun`` (multikey keys, e.g. ``red-owl``);
- ``kv_key``: 6 lowercase letters; ``kv_value``: 6 uppercase letters and digits, at least one
  digit (scoring reads value-shaped words: those that hold a digit);
- ``var_name``: 4 uppercase letters;
- ``function_name``: ``verb_noun`` (the real-text task's needle).
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable

ADJECTIVES = (
    "red", "blue", "green", "gold", "gray", "pink", "dark", "pale",
    "tall", "tiny", "wild", "calm", "bold", "cold", "warm", "soft",
)
NOUNS = (
    "owl", "fox", "elk", "cat", "yak", "bee", "ant", "cod",
    "emu", "hen", "ram", "eel", "jay", "koi", "pug", "wren",
)


NUMBER_DIGITS = (5, 7)
VERBS = ("read", "parse", "open", "load", "fetch", "flush", "merge", "split", "encode", "scan")
OBJECTS = ("frame", "record", "buffer", "header", "socket", "entry", "block", "token", "chunk")
KV_KEY_LEN, KV_VALUE_LEN, VAR_NAME_LEN = 6, 6, 4


def number(rng: random.Random) -> str:
    num_digits = rng.randint(*NUMBER_DIGITS)
    return str(rng.randint(10 ** (num_digits - 1), 10**num_digits - 1))


def label(rng: random.Random) -> str:
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


def similar_label(rng: random.Random, like: str) -> str:
    """A label sharing one word with ``like`` (a hard distractor)."""
    adjective, noun = like.split("-")
    if rng.random() < 0.5:
        return f"{adjective}-{rng.choice(NOUNS)}"
    return f"{rng.choice(ADJECTIVES)}-{noun}"


def kv_key(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase, k=KV_KEY_LEN))


def kv_value(rng: random.Random) -> str:
    chars = [rng.choice(string.digits),
             *rng.choices(string.ascii_uppercase + string.digits, k=KV_VALUE_LEN - 1)]
    rng.shuffle(chars)
    return "".join(chars)


def var_name(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_uppercase, k=VAR_NAME_LEN))


def function_name(rng: random.Random) -> str:
    return f"{rng.choice(VERBS)}_{rng.choice(OBJECTS)}"


def distinct(
    rng: random.Random,
    make: Callable[[random.Random], str],
    count: int,
    exclude: tuple[str, ...] = (),
) -> tuple[str, ...]:
    """``count`` values from ``make``, all different from each other and from ``exclude``."""
    taken = set(exclude)
    values: list[str] = []
    while len(values) < count:
        value = make(rng)
        if value not in taken:
            taken.add(value)
            values.append(value)
    return tuple(values)
