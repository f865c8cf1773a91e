"""Random needle contents: short, ASCII and of fixed shapes, so answers are exact-match checkable.

- ``number``: 5 to 7 digits, no leading zero (passkeys, multikey and vartrack values);
- ``label``: ``adjective-noun`` (multikey keys, e.g. ``red-owl``);
- ``kv_key``: 5 lowercase letters or digits; ``kv_value``: 6 uppercase letters or digits;
- ``var_name``: 4 uppercase letters.
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
KV_KEY_LEN, KV_VALUE_LEN, VAR_NAME_LEN = 5, 6, 4


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
    return "".join(rng.choices(string.ascii_lowercase + string.digits, k=KV_KEY_LEN))


def kv_value(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_uppercase + string.digits, k=KV_VALUE_LEN))


def var_name(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_uppercase, k=VAR_NAME_LEN))


# the longest value of each shape, for the worst-case size of a sample (tasks.min_context_len)
LONGEST_NUMBER = "9" * NUMBER_DIGITS[1]
LONGEST_LABEL = f"{max(ADJECTIVES, key=len)}-{max(NOUNS, key=len)}"
LONGEST_KV_KEY, LONGEST_KV_VALUE = "k" * KV_KEY_LEN, "V" * KV_VALUE_LEN
LONGEST_VAR_NAME = "N" * VAR_NAME_LEN


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
