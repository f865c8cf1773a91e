"""Fixed-size KV blob: header + K + V + slot positions (see docs/architecture.md, "Blob format").

A blob's size depends only on (model, layout, dtype), never on the prompt length. Decoding checks
every header field against what the reader expects and raises a specific :class:`BlobError`.
Encoding copies each tensor once into the output buffer; decoding makes no copy (the tensors view
the buffer).
"""

from __future__ import annotations

import struct
import warnings
import zlib
from dataclasses import dataclass

import torch

from snapstream.config import ModelConfig
from snapstream.kvcache import SequenceCache
from snapstream.policy import CacheLayout

MAGIC = b"SNAPKV\x00\x00"
VERSION = 1
# magic, version, header size, fingerprint, L, Hkv, D, n_sink, n_topk, n_recent, n_ring, dtype,
# prompt_len, next_position, ring slot, payload size, payload crc32 | header crc32
_HEADER = struct.Struct("<8sHH32s7IB3xQQIQI")
_HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _HEADER_CRC.size
DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}
DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


class BlobError(ValueError):
    """A blob that cannot be used; the subclass names the problem."""


class BlobTruncated(BlobError): ...


class BlobCorrupted(BlobError): ...


class BlobVersionMismatch(BlobError): ...


class BlobModelMismatch(BlobError): ...


class BlobLayoutMismatch(BlobError): ...


@dataclass(frozen=True)
class BlobSpec:
    """What a reader expects: the model (fingerprint + shapes) and the KV dtype."""

    fingerprint: bytes
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def for_model(cls, config: ModelConfig, fingerprint: bytes, dtype: torch.dtype) -> BlobSpec:
        return cls(fingerprint, config.num_layers, config.num_kv_heads, config.head_dim, dtype)

    def payload_size(self, layout: CacheLayout) -> int:
        slots = self.num_layers * self.num_kv_heads * layout.budget
        return 2 * slots * self.head_dim * self.dtype.itemsize + slots * 4

    def blob_size(self, layout: CacheLayout) -> int:
        return HEADER_SIZE + self.payload_size(layout)


def encode_blob(cache: SequenceCache, spec: BlobSpec) -> bytearray:
    layout = cache.layout
    buf = bytearray(spec.blob_size(layout))
    out = torch.frombuffer(buf, dtype=torch.uint8)  # writable view of buf
    offset = HEADER_SIZE
    for tensor in (cache.k.to(spec.dtype), cache.v.to(spec.dtype), cache.positions):
        raw = tensor.detach().contiguous().cpu().view(-1).view(torch.uint8)
        out[offset : offset + raw.numel()].copy_(raw)
        offset += raw.numel()
    payload_crc = zlib.crc32(memoryview(buf)[HEADER_SIZE:])
    _HEADER.pack_into(
        buf, 0, MAGIC, VERSION, HEADER_SIZE, spec.fingerprint, spec.num_layers,
        spec.num_kv_heads, spec.head_dim, layout.n_sink, layout.n_topk, layout.n_recent,
        layout.n_ring, DTYPE_CODES[spec.dtype], cache.prompt_len, cache.next_position,
        layout.slot_of(cache.next_position), spec.payload_size(layout), payload_crc,
    )
    _HEADER_CRC.pack_into(buf, _HEADER.size, zlib.crc32(memoryview(buf)[: _HEADER.size]))
    return buf


def decode_blob(
    data: bytes | bytearray | memoryview, spec: BlobSpec, layout: CacheLayout | None = None
) -> SequenceCache:
    """Validate and view ``data`` as a cache; ``layout``, when given, must match the blob's."""
    view = memoryview(data)
    if len(view) < HEADER_SIZE:
        raise BlobTruncated(f"blob has {len(view)} bytes, shorter than its "
                            f"{HEADER_SIZE}-byte header")
    fields = _HEADER.unpack_from(view, 0)
    if fields[0] != MAGIC:
        raise BlobCorrupted(f"bad magic {bytes(fields[0])!r}: not a snapstream KV blob")
    if fields[1] != VERSION:
        raise BlobVersionMismatch(f"blob format version {fields[1]}, this reader handles {VERSION}")
    (header_crc,) = _HEADER_CRC.unpack_from(view, _HEADER.size)
    if zlib.crc32(view[: _HEADER.size]) != header_crc:
        raise BlobCorrupted("header checksum mismatch: the blob header is corrupted")
    blob_layout, prompt_len, next_position = _check_header(fields, spec, layout)
    payload = view[HEADER_SIZE:]
    if len(payload) != spec.payload_size(blob_layout):
        raise BlobTruncated(f"payload has {len(payload)} bytes, the header promises "
                            f"{spec.payload_size(blob_layout)}")
    if zlib.crc32(payload) != fields[-1]:
        raise BlobCorrupted("payload checksum mismatch: the blob's K/V data is corrupted")
    return _view_cache(payload, spec, blob_layout, prompt_len, next_position)


def _check_header(fields: tuple, spec: BlobSpec, layout: CacheLayout | None):
    (_, _, header_size, fingerprint, num_layers, num_kv_heads, head_dim, n_sink, n_topk,
     n_recent, n_ring, dtype_code, prompt_len, next_position, ring_slot, _, _) = fields
    if header_size != HEADER_SIZE:
        raise BlobCorrupted(f"header size {header_size}, expected {HEADER_SIZE}")
    if fingerprint != spec.fingerprint:
        raise BlobModelMismatch(f"blob was made by model {fingerprint.hex()[:16]}, this worker "
                                f"serves {spec.fingerprint.hex()[:16]}")
    shape, expected = (num_layers, num_kv_heads, head_dim), (
        spec.num_layers, spec.num_kv_heads, spec.head_dim)
    if shape != expected:
        raise BlobModelMismatch(f"blob has (layers, kv heads, head dim) {shape}, "
                                f"expected {expected}")
    if DTYPES.get(dtype_code) != spec.dtype:
        raise BlobLayoutMismatch(f"blob dtype {DTYPES.get(dtype_code, dtype_code)}, expected "
                                 f"{spec.dtype}")
    try:
        blob_layout = CacheLayout(n_sink, n_topk, n_recent, n_ring)
    except ValueError as exc:
        raise BlobCorrupted(f"blob header holds an invalid layout: {exc}") from exc
    if layout is not None and blob_layout != layout:
        raise BlobLayoutMismatch(f"blob layout {blob_layout} does not match the expected {layout}")
    if not 0 < prompt_len <= next_position or ring_slot != blob_layout.slot_of(next_position):
        raise BlobCorrupted(f"inconsistent ring state: prompt_len={prompt_len}, "
                            f"next_position={next_position}, ring slot={ring_slot}")
    return blob_layout, prompt_len, next_position


def _view_cache(payload: memoryview, spec: BlobSpec, layout: CacheLayout, prompt_len: int,
                next_position: int) -> SequenceCache:
    slots = (spec.num_layers, spec.num_kv_heads, layout.budget)
    kv_count = slots[0] * slots[1] * slots[2] * spec.head_dim
    with warnings.catch_warnings():  # read-only buffers: the cache is never written in place
        warnings.simplefilter("ignore", UserWarning)
        k = torch.frombuffer(payload, dtype=spec.dtype, count=kv_count)
        v = torch.frombuffer(payload, dtype=spec.dtype, count=kv_count,
                             offset=kv_count * spec.dtype.itemsize)
        positions = torch.frombuffer(payload, dtype=torch.int32,
                                     offset=2 * kv_count * spec.dtype.itemsize)
    return SequenceCache(
        layout=layout, k=k.view(*slots, spec.head_dim), v=v.view(*slots, spec.head_dim),
        positions=positions.view(slots), prompt_len=prompt_len, next_position=next_position,
    )
