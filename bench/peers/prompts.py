"""Benchmark prompts as token ids: deterministic offline prose with a passkey in it.

The filler is the text of the licences in /usr/share/common-licenses (Debian's base-files),
read in name order; the passkey sentence sits at ``depth`` of the prompt and the prompt ends by
asking for it. Prompts are raw text, no chat template (a base model such as Gemma 3 has none),
led by the ids the tokenizer puts before any text (BOS where the model asks for one: Gemma 3;
none for SmolLM2). The main process tokenizes once and every system gets the same ids.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from bench.peers.models import tokenizer_dir
from bench.peers.venvs import Echo

if TYPE_CHECKING:
    from snapstream.tokenizer import Tokenizer

LICENSES = Path("/usr/share/common-licenses")
QUESTION = "\n\nWhat is the pass key? The pass key is"


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...  # no special tokens
    def decode(self, ids: Sequence[int]) -> str: ...
    def start_ids(self) -> list[int]: ...  # what leads a document (BOS or nothing)


@dataclass(frozen=True)
class Prompt:
    name: str
    token_ids: tuple[int, ...]
    passkey: str


class EngineTokenizer:
    """snapstream's own tokenizer (``Engine.tokenizer``) as a :class:`TextTokenizer`: its
    ``encode`` adds BOS where the model wants one, which only the prompt's start may have."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._inner = tokenizer.inner

    def encode(self, text: str) -> list[int]:
        return self._inner.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._inner.decode(list(ids))

    def start_ids(self) -> list[int]:
        return self._inner.encode("", add_special_tokens=True).ids


class _HFTokenizer:
    def __init__(self, directory: Path) -> None:
        from transformers import AutoTokenizer

        self._inner = AutoTokenizer.from_pretrained(str(directory))

    def encode(self, text: str) -> list[int]:
        return self._inner.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self._inner.decode(list(ids))

    def start_ids(self) -> list[int]:
        return self._inner.encode("", add_special_tokens=True)


def load_tokenizer(gguf: Path, echo: Echo) -> TextTokenizer:
    """The model's tokenizer as transformers reads it from the GGUF (converted once, then
    loaded from the cache: ``models.tokenizer_dir``)."""
    return _HFTokenizer(tokenizer_dir(gguf, echo))


def filler_text(root: Path = LICENSES) -> str:
    files = sorted(p for p in root.iterdir() if p.is_file()) if root.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no filler text: {root} has no files (Debian base-files)")
    return "\n\n".join(p.read_text(errors="replace") for p in files)


def passkey_prompt(tokenizer: TextTokenizer, filler_ids: Sequence[int], num_tokens: int,
                   depth: float = 0.5, seed: int = 0) -> Prompt:
    """A prompt of exactly ``num_tokens`` ids: the tokenizer's start ids, filler, the passkey
    sentence at ``depth``, more filler, the question. The passkey is fixed by ``num_tokens`` and
    ``seed``."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth}")
    passkey = str(random.Random(num_tokens + 1_000_003 * seed).randint(10000, 99999))
    needle = tokenizer.encode(f"\n\nThe pass key is {passkey}. Remember it. {passkey} is the "
                              "pass key.\n\n")
    question = tokenizer.encode(QUESTION)
    start = tokenizer.start_ids()
    num_filler = num_tokens - len(start) - len(needle) - len(question)
    if num_filler < 0 or num_filler > len(filler_ids):
        raise ValueError(f"a {num_tokens}-token prompt needs {num_filler} filler tokens; "
                         f"the filler has {len(filler_ids)}")
    cut = round(num_filler * depth)
    ids = (*start, *filler_ids[:cut], *needle, *filler_ids[cut:num_filler], *question)
    return Prompt(f"{num_tokens}", tuple(ids), passkey)


def passkey_prompts(tokenizer: TextTokenizer, lengths: Sequence[int]) -> list[Prompt]:
    filler_ids = tokenizer.encode(filler_text())
    return [passkey_prompt(tokenizer, filler_ids, n) for n in lengths]


def distinct_passkey_prompts(tokenizer: TextTokenizer, num_tokens: int, count: int
                             ) -> list[Prompt]:
    """``count`` prompts of ``num_tokens`` ids that share no prefix (the filler is rotated by a
    different amount for each), so no prefix cache can skip a prefill."""
    filler_ids = tokenizer.encode(filler_text())
    step = len(filler_ids) // max(count, 1)
    return [passkey_prompt(tokenizer, filler_ids[i * step :] + filler_ids[: i * step],
                           num_tokens) for i in range(count)]
