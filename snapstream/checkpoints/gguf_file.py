"""A GGUF file: metadata and tensors (gguf_reader.py), for the checkpoint that reads it.

Tensors are memory-mapped; :meth:`GGUFFile.array` dequantizes one to float32 with
``gguf.quants``, and :meth:`GGUFFile.release` gives a read tensor's pages back. Tensor types
that are neither served as exact blocks (:mod:`snapstream.checkpoints.gguf_blocks`) nor
dequantized to float32 are refused when the file is opened.
Torch-free: the router reads config and tokenizer from here.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from snapstream.checkpoints.gguf_blocks import READABLE_TYPES, SUPPORTED_TYPES
from snapstream.checkpoints.gguf_reader import read_gguf

GGUF_MAGIC = b"GGUF"
_MISSING = object()


def is_gguf(path: Path) -> bool:
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


class GGUFFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._mapped, self.metadata, self.tensors = read_gguf(self.path)
        except (ValueError, OSError, struct.error, UnicodeDecodeError) as exc:
            raise ValueError(f"{self.path}: not a readable GGUF file, truncated or corrupt "
                             f"({exc}); `snapstream models pull NAME` puts a named model's file "
                             "in place again, another must be copied or converted again") from None
        for name, info in self.tensors.items():
            if info.tensor_type not in READABLE_TYPES:
                raise ValueError(f"{self.path}: tensor {name} is {info.tensor_type.name}, a "
                                 f"type snapstream does not serve (supported: {SUPPORTED_TYPES}); "
                                 "convert the file to one of those")

    @property
    def architecture(self) -> str:
        return self.get("general.architecture")

    def get(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.metadata:
            return self.metadata[key]
        if default is _MISSING:
            raise ValueError(f"{self.path}: metadata key {key!r} is missing")
        return default

    def arch_get(self, suffix: str, default: Any = _MISSING) -> Any:
        """``{architecture}.{suffix}``, e.g. ``llama.block_count``."""
        return self.get(f"{self.architecture}.{suffix}", default)

    def release(self, name: str, rows: slice = slice(None)) -> None:
        """Give tensor ``name``'s pages of the mapped file back, those of ``rows`` (they are
        read again if the tensor is), so that a loaded model does not also keep the file
        resident, nor a tensor read a chunk of rows at a time its rows already read."""
        data = self.tensors[name].data[rows]
        start = data.__array_interface__["data"][0] - self._mapped.__array_interface__["data"][0]
        first = start // mmap.PAGESIZE * mmap.PAGESIZE
        self._mapped._mmap.madvise(mmap.MADV_DONTNEED, first, start + data.nbytes - first)

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` dequantized to float32, in PyTorch's layout (out_features,
        in_features)."""
        info = self.tensors[name]
        values = gguf.quants.dequantize(info.data, info.tensor_type)
        shape = tuple(int(n) for n in reversed(info.shape))  # GGUF lists the fastest dim first
        # a copy: F32 tensors would otherwise view the read-only map
        return np.array(values, dtype=np.float32).reshape(shape)
