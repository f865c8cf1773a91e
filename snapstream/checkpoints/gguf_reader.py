"""A GGUF file's layout, parsed in one pass: metadata as Python values, tensors as views of the
memory-mapped file. (``gguf.GGUFReader`` keeps a numpy view per array element: ~50 s for the
262k-token vocabulary of Gemma 3, against well under a second here.) Format: llama.cpp's
gguf.md, versions 2 and 3."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
VERSIONS = (2, 3)
STRING, ARRAY = 8, 9
# value type -> numpy dtype of its scalars (little-endian)
SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
           10: "<u8", 11: "<i8", 12: "<f8"}
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF's order: the fastest-varying dimension first
    tensor_type: GGMLQuantizationType
    data: np.ndarray  # uint8 (rows, bytes per row), a view of the mapped file


class _Cursor:
    def __init__(self, buffer: np.ndarray) -> None:
        self.buffer, self.offset = buffer, 0
        self.raw = memoryview(buffer)

    def unpack(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self.raw, self.offset)
        self.offset += struct.calcsize(fmt)
        return values

    def string(self) -> str:
        (length,) = self.unpack("<Q")
        start, self.offset = self.offset, self.offset + length
        return bytes(self.raw[start:self.offset]).decode("utf-8")

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            element, count = self.unpack("<IQ")
            if element in SCALARS:
                dtype = np.dtype(SCALARS[element])
                end = self.offset + count * dtype.itemsize
                values = self.buffer[self.offset:end].view(dtype).tolist()
                self.offset = end
                return values
            return [self.value(element) for _ in range(count)]
        if kind not in SCALARS:
            raise ValueError(f"unknown metadata value type {kind}")
        dtype = np.dtype(SCALARS[kind])
        (value,) = self.buffer[self.offset:self.offset + dtype.itemsize].view(dtype).tolist()
        self.offset += dtype.itemsize
        return value


def read_gguf(path: Path) -> tuple[np.memmap, dict[str, Any], dict[str, TensorInfo]]:
    """The mapped file, its metadata and tensors; ValueError when it is not a GGUF file or is
    truncated."""
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    cursor = _Cursor(mapped)
    magic, version, num_tensors, num_fields = cursor.unpack("<4sIQQ")
    if magic != MAGIC or version not in VERSIONS:
        raise ValueError(f"magic {magic!r}, version {version}: not a GGUF file of version "
                         f"{VERSIONS}")
    metadata = {}
    for _ in range(num_fields):
        key = cursor.string()
        (kind,) = cursor.unpack("<I")
        metadata[key] = cursor.value(kind)
    infos = []
    for _ in range(num_tensors):
        name = cursor.string()
        (num_dims,) = cursor.unpack("<I")
        shape = cursor.unpack(f"<{num_dims}Q")
        kind, offset = cursor.unpack("<IQ")
        infos.append((name, shape, GGMLQuantizationType(kind), offset))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    start = -(-cursor.offset // alignment) * alignment
    return mapped, metadata, {name: _tensor(mapped, start, name, shape, kind, offset)
                      for name, shape, kind, offset in infos}


def _tensor(mapped: np.ndarray, start: int, name: str, shape: tuple[int, ...],
            kind: GGMLQuantizationType, offset: int) -> TensorInfo:
    if kind not in GGML_QUANT_SIZES:
        raise ValueError(f"tensor {name} has type {kind.name}, of unknown size")
    block_size, type_size = GGML_QUANT_SIZES[kind]
    row_bytes = shape[0] // block_size * type_size
    rows = int(np.prod(shape[1:], dtype=np.int64))
    begin = start + offset
    if begin + rows * row_bytes > mapped.size:
        raise ValueError(f"tensor {name} ends past the end of the file")
    data = mapped[begin:begin + rows * row_bytes].reshape(rows, row_bytes)
    return TensorInfo(name, tuple(shape), kind, data)
