"""Fixed-size KV blob: header + group table + per layer group K, V, slot positions (see
docs/architecture.md, "Blob format").

A blob's size depends only on (model, layout, dtype), never on the prompt length. Decoding checks
every header field against what the reader expects and raises a specific :class:`BlobError`.
Encoding copies each tensor once into the output buffer; decoding makes no copy (the tensors view
the buffer).

The format is version 4. A blob carries layer groups (a hybrid model's global layers in the
policy's layout, its sliding-window layers in a ring of their window) and is sealed
(:mod:`kvstore.seal`): the header carries the SHA-256 of the token ids the cache was made from
and ends with an HMAC-SHA256, under the cluster secret, of the store key, the header and the
payload. K and V rows are stored
in the cache's KV dtype (:mod:`snapstream.kvquant`) and copied as they are: float rows, int8 rows
of D codes + a float32 scale, or fp8 e4m3 rows of D values of each row's Hadamard transform (no
scale). A reader refuses a dtype code it does not know (code 5 is retired and refused like any
unknown code), and a blob of another version with :class:`BlobVersionMismatch`.
"""

from __future__ import annotations

import hmac
import struct
import warnings
from dataclasses import dataclass

import torch

from kvstore.blob_errors import (
    BlobCorrupted,
    BlobForged,
    BlobLayoutMismatch,
    BlobModelMismatch,
    BlobTokensMismatch,
    BlobTruncated,
    BlobVersionMismatch,
)
from kvstore.seal import MAC_SIZE, NO_TOKENS, Seal
from snapstream.config import ModelConfig
from snapstream.kvcache import GroupKV, LayerGroup, ModelLayout, SequenceCache
from snapstream.kvquant import kv_codec, kv_slot_bytes, to_kv
from snapstream.policy import CacheLayout

MAGIC = b"SNAPKV\x00\x00"
VERSION = 4
# magic, version | header size (fixed part + group table + MAC), fingerprint, L, Hkv, D, dtype,
# number of groups, prompt_len, next_position, payload size, SHA-256 of the cache's token ids
_PREFIX = struct.Struct("<8sH")
_FIXED = struct.Struct("<8sHI32s3IBxHQQQ32s")
# per group: window (0: global layers), n_sink, n_topk, n_recent, n_ring, number of layers;
# then its layer indices (uint16 each)
_GROUP = struct.Struct("<5IH")
_LAYER = struct.Struct("<H")
POSITION_BYTES = 4  # each slot's absolute position (int32), per layer and KV head
DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3, torch.int8: 4,
               torch.float8_e4m3fn: 6}
DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


def header_size(layout: ModelLayout) -> int:
    """Bytes of a blob's header for ``layout``: fixed part, group table, MAC."""
    table = sum(_GROUP.size + len(group.layers) * _LAYER.size for group in layout.groups)
    return _FIXED.size + table + MAC_SIZE


@dataclass(frozen=True)
class BlobSpec:
    """What a reader expects: the model (fingerprint, shapes, each layer's sliding window) and
    the KV dtype."""

    fingerprint: bytes
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype  # a KV dtype of snapstream.kvquant
    windows: tuple[int | None, ...]  # per layer; None: a global layer

    @classmethod
    def for_model(cls, config: ModelConfig, fingerprint: bytes, dtype: torch.dtype) -> BlobSpec:
        return cls(fingerprint, config.num_layers, config.num_kv_heads, config.head_dim, dtype,
                   config.attention_windows)

    def model_layout(self, layout: CacheLayout) -> ModelLayout:
        """The layer groups of this model for a policy's ``layout``."""
        return ModelLayout.build(self.windows, layout)

    @property
    def row_width(self) -> int:
        """Elements of ``dtype`` per slot's K (or V) row: D, or D + 4 for int8."""
        return kv_codec(self.dtype).row_width(self.head_dim)

    def payload_size(self, layout: ModelLayout) -> int:
        slots = layout.num_slots * self.num_kv_heads
        return slots * (kv_slot_bytes(self.dtype, self.head_dim) + POSITION_BYTES)

    def blob_size(self, layout: ModelLayout) -> int:
        return header_size(layout) + self.payload_size(layout)


def encode_blob(cache: SequenceCache, spec: BlobSpec, seal: Seal) -> bytearray:
    """The blob of ``cache``, sealed for the key and tokens ``seal`` names."""
    layout = cache.layout
    size = header_size(layout)
    buf = bytearray(spec.blob_size(layout))
    out = torch.frombuffer(buf, dtype=torch.uint8)  # writable view of buf
    offset = size
    for part in cache.groups:
        for tensor in (to_kv(part.k, spec.dtype), to_kv(part.v, spec.dtype), part.positions):
            raw = tensor.detach().contiguous().cpu().view(-1).view(torch.uint8)
            out[offset : offset + raw.numel()].copy_(raw)
            offset += raw.numel()
    _FIXED.pack_into(
        buf, 0, MAGIC, VERSION, size, spec.fingerprint, spec.num_layers, spec.num_kv_heads,
        spec.head_dim, DTYPE_CODES[spec.dtype], len(layout.groups), cache.prompt_len,
        cache.next_position, spec.payload_size(layout),
        NO_TOKENS if seal.tokens is None else seal.tokens,
    )
    offset = _FIXED.size
    for group in layout.groups:
        g = group.layout
        _GROUP.pack_into(buf, offset, group.window or 0, g.n_sink, g.n_topk, g.n_recent,
                         g.n_ring, len(group.layers))
        offset += _GROUP.size
        for layer in group.layers:
            _LAYER.pack_into(buf, offset, layer)
            offset += _LAYER.size
    buf[offset:size] = _mac(memoryview(buf), size, seal)
    return buf


def _mac(view: memoryview, size: int, seal: Seal) -> bytes:
    """The MAC of a blob whose header is ``size`` bytes: the key, the header up to its MAC, the
    payload."""
    mac = seal.secret.mac(seal.key)
    mac.update(view[: size - MAC_SIZE])
    mac.update(view[size:])
    return mac.digest()


def decode_blob(
    data: bytes | bytearray | memoryview, spec: BlobSpec, seal: Seal,
    layout: ModelLayout | None = None
) -> SequenceCache:
    """Validate and view ``data`` as a cache: its MAC for ``seal``'s key first (BlobForged: no
    field of a blob that fails it is read past the header's size), then every header field and
    the tokens ``seal`` expects; ``layout``, when given, must match the blob's."""
    view = memoryview(data)
    if len(view) < _FIXED.size + MAC_SIZE:
        raise BlobTruncated(f"blob has {len(view)} bytes, shorter than its header")
    magic, version = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise BlobCorrupted(f"bad magic {bytes(magic)!r}: not a snapstream KV blob")
    if version != VERSION:
        raise BlobVersionMismatch(f"blob format version {version}, this reader handles "
                                  f"{VERSION}: prefill it again")
    fields = _FIXED.unpack_from(view, 0)
    size = fields[2]
    if not _FIXED.size + MAC_SIZE <= size <= len(view):
        raise BlobTruncated(f"blob has {len(view)} bytes, its header claims {size}")
    if not hmac.compare_digest(_mac(view, size, seal), view[size - MAC_SIZE:size]):
        raise BlobForged(f"blob {seal.key!r} fails its MAC: written without this cluster's "
                         "secret or under another key, or altered since")
    blob_layout, prompt_len, next_position = _check_header(view, fields, spec, layout)
    payload = view[size:]
    if len(payload) != spec.payload_size(blob_layout):
        raise BlobTruncated(f"payload has {len(payload)} bytes, the header promises "
                            f"{spec.payload_size(blob_layout)}")
    if seal.tokens is not None and fields[-1] != seal.tokens:
        raise BlobTokensMismatch(f"blob {seal.key!r} was made from other tokens than the "
                                 "request's")
    return _view_cache(payload, spec, blob_layout, prompt_len, next_position)


def _read_groups(view: memoryview, num_groups: int, end: int) -> ModelLayout:
    """The group table after the fixed header (ending before byte ``end``) -> its layout."""
    groups, offset = [], _FIXED.size
    try:
        for _ in range(num_groups):
            window, n_sink, n_topk, n_recent, n_ring, count = _GROUP.unpack_from(view, offset)
            offset += _GROUP.size
            layers = tuple(_LAYER.unpack_from(view, offset + i * _LAYER.size)[0]
                           for i in range(count))
            offset += count * _LAYER.size
            groups.append(LayerGroup(layers, CacheLayout(n_sink, n_topk, n_recent, n_ring),
                                     window or None))
        if offset != end:
            raise ValueError(f"the group table ends at byte {offset}, the header at {end}")
        return ModelLayout(tuple(groups))
    except (ValueError, struct.error) as exc:
        raise BlobCorrupted(f"blob header holds an invalid layout: {exc}") from exc


def _check_header(view: memoryview, fields: tuple, spec: BlobSpec, layout: ModelLayout | None):
    (_, _, size, fingerprint, num_layers, num_kv_heads, head_dim, dtype_code, num_groups,
     prompt_len, next_position, _, _) = fields
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
    blob_layout = _read_groups(view, num_groups, size - MAC_SIZE)
    own = spec.model_layout(blob_layout.groups[0].layout)
    if blob_layout != own:
        raise BlobLayoutMismatch(f"blob layer groups {blob_layout} are not this model's for "
                                 f"that layout ({own})")
    if layout is not None and blob_layout != layout:
        raise BlobLayoutMismatch(f"blob layout {blob_layout} does not match the expected {layout}")
    if not 0 < prompt_len <= next_position:
        raise BlobCorrupted(f"inconsistent positions: prompt_len={prompt_len}, "
                            f"next_position={next_position}")
    return blob_layout, prompt_len, next_position


def _view_cache(payload: memoryview, spec: BlobSpec, layout: ModelLayout, prompt_len: int,
                next_position: int) -> SequenceCache:
    parts, offset = [], 0
    with warnings.catch_warnings():  # read-only buffers: the cache is never written in place
        warnings.simplefilter("ignore", UserWarning)
        for group in layout.groups:
            slots = (len(group.layers), spec.num_kv_heads, group.layout.budget)
            count = slots[0] * slots[1] * slots[2]
            row = spec.row_width
            k, v = (torch.frombuffer(payload, dtype=spec.dtype, count=count * row,
                                     offset=offset + i * count * row * spec.dtype.itemsize
                                     ).view(*slots, row)
                    for i in range(2))  # (Lg, Hkv, S, W)
            offset += 2 * count * row * spec.dtype.itemsize
            positions = torch.frombuffer(payload, dtype=torch.int32, count=count, offset=offset)
            offset += count * 4
            parts.append(GroupKV(group, k, v, positions.view(slots)))
    return SequenceCache(tuple(parts), prompt_len=prompt_len, next_position=next_position)
