"""Tokenizers: Hugging Face ``tokenizer.json`` through ``tokenizers``, or a byte-level one that a
checkpoint declares in ``tokenizer_config.json`` (``"tokenizer_class": "ByteTokenizer"``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import tokenizers


class Tokenizer(Protocol):
    vocab_size: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; special tokens follow."""

    bos_token_id: int | None = 256
    eos_token_ids: tuple[int, ...] = (257,)
    vocab_size: int = 259
    add_bos: bool = True

    def encode(self, text: str) -> list[int]:
        prefix = [self.bos_token_id] if self.add_bos and self.bos_token_id is not None else []
        return prefix + list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def to_config(self) -> dict:
        return {"tokenizer_class": "ByteTokenizer", "bos_token_id": self.bos_token_id,
                "eos_token_id": list(self.eos_token_ids), "vocab_size": self.vocab_size,
                "add_bos_token": self.add_bos}

    @classmethod
    def from_config(cls, config: dict) -> ByteTokenizer:
        eos = config.get("eos_token_id", [257])
        return cls(bos_token_id=config.get("bos_token_id", 256),
                   eos_token_ids=tuple(eos if isinstance(eos, list) else [eos]),
                   vocab_size=config.get("vocab_size", 259),
                   add_bos=config.get("add_bos_token", True))


@dataclass(frozen=True)
class HFTokenizer:
    inner: tokenizers.Tokenizer
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @property
    def vocab_size(self) -> int:
        return self.inner.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(list(ids), skip_special_tokens=True)


def _load_byte(path: Path, config: dict, model_config: dict) -> Tokenizer:
    return ByteTokenizer.from_config(config)


def _load_hf(path: Path, config: dict, model_config: dict) -> Tokenizer:
    eos = model_config.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return HFTokenizer(tokenizers.Tokenizer.from_file(str(path / "tokenizer.json")),
                       bos_token_id=model_config.get("bos_token_id"), eos_token_ids=eos_ids)


TOKENIZER_CLASSES: dict[str, Callable[[Path, dict, dict], Tokenizer]] = {
    "ByteTokenizer": _load_byte,
}


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    model_config_file = path / "config.json"
    model_config = json.loads(model_config_file.read_text()) if model_config_file.exists() else {}
    loader = TOKENIZER_CLASSES.get(config.get("tokenizer_class", ""))
    if loader is None and (path / "tokenizer.json").exists():
        loader = _load_hf
    if loader is None:
        raise ValueError(f"{path}: no tokenizer.json and no known tokenizer_class in "
                         f"tokenizer_config.json (known: {sorted(TOKENIZER_CLASSES)})")
    return loader(path, config, model_config)


class IncrementalDetokenizer:
    """Turns a growing list of ids into text deltas that never split a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the ids decoded for context
        self.read_offset = 0  # ids up to here have been emitted

    def feed(self, new_ids: Sequence[int]) -> str:
        self.ids.extend(new_ids)
        return self._delta(final=False)

    def flush(self) -> str:
        return self._delta(final=True)

    def _delta(self, final: bool) -> str:
        decode = self.tokenizer.decode
        emitted = decode(self.ids[self.prefix_offset : self.read_offset])
        text = decode(self.ids[self.prefix_offset :])
        if len(text) <= len(emitted) or (text.endswith("\ufffd") and not final):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(emitted) :]
