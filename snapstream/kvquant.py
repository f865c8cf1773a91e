"""How K/V vectors are stored in a cache: one registry of KV dtypes, keyed by the torch dtype of
the stored tensors (sequence caches, blobs and decode pools alike).

- float32, bfloat16 (and float16): each slot's row holds its D values as they are.
- int8: each slot's row holds D int8 codes and, after them, the row's float32 scale in 4 bytes
  (a row of D + 4 int8): symmetric, ``scale = max |x| / 127``, ``code = round(x / scale)``,
  ``x ~ code * scale`` (error at most ``scale / 2`` per value). The scale travels in the row, so
  every slot-wise operation (placing, rolling a ring, copying into a pool, the blob's bytes)
  moves codes and scale together and never re-quantizes a stored slot. The decode kernel
  (snapstream/csrc/slot_attention.cpp) writes a step's new row with the same arithmetic, so a
  row quantized there and one quantized here are the same bytes.
- float8_e4m3fn: each slot's row holds the normalized Hadamard transform of its D values
  (``hadamard``; D a power of two) in fp8 e4m3 (4 exponent bits, 3 mantissa bits), rounded to
  nearest and saturated at +-448, with no scale: a row of D bytes, so K and V take exactly a
  quarter of float32's bytes. The transform is orthogonal, so a query's dot products with the
  stored keys (rotated the same way) and a value row's norm are unchanged, but a key's few large
  channels, whose 1/16 relative rounding error dominated its dot products, are spread over all D
  values: against float32 KV the decode's mean KL fell 2.8x (docs/benchmarks.md, "KV
  dtypes").
  A row's rounding error is at most 1/16 of its norm (below 2^-6 per value, 2^-10). The decode
  kernel rotates the step's query, key and value and the attention's output with the same
  butterflies and writes the rows through torch's own conversion, so its bytes equal these.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import snapstream._kernels  # noqa: F401  (defines snapstream::int8_rows, runs it on the CPU)

SCALE_BYTES = 4  # a float32 scale after each int8 row's codes


@dataclass(frozen=True)
class PlainKV:
    """Rows of D values in ``dtype``."""

    dtype: torch.dtype

    def row_width(self, head_dim: int) -> int:
        return head_dim

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) float -> (..., D) in ``dtype``."""
        return x.to(self.dtype)

    def decode(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (..., D) -> the same values (no copy)."""
        return rows


@dataclass(frozen=True)
class Int8KV:
    """Rows of D int8 codes + a float32 scale (absmax / 127) per row, i.e. per slot and head."""

    dtype: torch.dtype = torch.int8

    def row_width(self, head_dim: int) -> int:
        return head_dim + SCALE_BYTES

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) float -> rows (..., D + 4) int8: codes, then the scale's bytes (one pass
        per row on the CPU: snapstream/csrc/int8_rows.h, the decode kernel's own rows)."""
        return torch.ops.snapstream.int8_rows(x)

    def decode(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (..., D + 4) int8 -> (..., D) float32."""
        scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)  # (..., 1)
        return rows[..., :-SCALE_BYTES].float() * scale


def _int8_rows_elsewhere(x: torch.Tensor) -> torch.Tensor:
    """``int8_rows`` off the CPU, the same arithmetic in torch ops."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True) / 127  # (..., 1)
    codes = torch.where(scale > 0, x / scale, 0.0).round_().clamp_(-127, 127)  # (..., D)
    return torch.cat((codes.to(torch.int8), scale.view(torch.int8)), dim=-1)


_ELSEWHERE = torch.library.Library("snapstream", "IMPL")  # kept: it holds the registration
_ELSEWHERE.impl("int8_rows", _int8_rows_elsewhere, "CompositeExplicitAutograd")


@torch.library.register_fake("snapstream::int8_rows")
def _int8_rows_shape(x):
    return x.new_empty((*x.shape[:-1], x.shape[-1] + SCALE_BYTES), dtype=torch.int8)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """x (..., D) float, D a power of two -> H x (..., D) float32, H the normalized Sylvester
    Hadamard matrix (symmetric and orthogonal: ``hadamard(hadamard(x)) == x`` up to float32
    rounding). log2(D) butterfly stages, then the 1/sqrt(D) factor: the order of operations of
    snapstream/csrc/slot_attention.cpp's ``hadamard_in_place``, so both give the same bits."""
    dim = x.shape[-1]
    y = x.float()
    half = 1
    while half < dim:
        pairs = y.reshape(*y.shape[:-1], dim // (2 * half), 2, half)  # (..., blocks, 2, half)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).reshape(x.shape)
        half *= 2
    return y * dim**-0.5


@dataclass(frozen=True)
class Float8KV:
    """Rows of D fp8 e4m3 values of each row's Hadamard transform, no scale (saturating at
    +-448, the largest finite e4m3)."""

    dtype: torch.dtype = torch.float8_e4m3fn

    def row_width(self, head_dim: int) -> int:
        if head_dim & (head_dim - 1):
            raise ValueError(f"float8_e4m3fn KV stores each row's Hadamard transform, which needs "
                             f"a power-of-two head dimension; this model's is {head_dim}: use "
                             "--kv-dtype int8 or bfloat16")
        return head_dim

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) float -> (..., D) float8_e4m3fn of H x (torch's conversion saturates)."""
        return hadamard(x).to(self.dtype)

    def decode(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (..., D) float8_e4m3fn -> the values H rows (..., D) float32."""
        return hadamard(rows)


KV_CODECS = {
    torch.float32: PlainKV(torch.float32),
    torch.bfloat16: PlainKV(torch.bfloat16),
    torch.float16: PlainKV(torch.float16),
    torch.int8: Int8KV(),
    torch.float8_e4m3fn: Float8KV(),
}


def kv_codec(dtype: torch.dtype) -> PlainKV | Int8KV | Float8KV:
    if dtype not in KV_CODECS:
        raise ValueError(f"KV dtype {dtype} is not one of {sorted(map(str, KV_CODECS))}")
    return KV_CODECS[dtype]


def kv_slot_bytes(dtype: torch.dtype, head_dim: int) -> int:
    """Bytes of one slot of one layer and KV head in a cache of KV dtype ``dtype``: its K row
    and its V row (an int8 row's scale included)."""
    return 2 * kv_codec(dtype).row_width(head_dim) * dtype.itemsize


def to_kv(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """K or V rows in any KV dtype -> the same in ``dtype``: as they are when the dtypes agree
    (an int8 row is never re-quantized), else through float32."""
    if rows.dtype == dtype:
        return rows
    return kv_codec(dtype).encode(kv_float(rows))


BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32}  # an integer dtype per element width


def as_bits(rows: torch.Tensor) -> torch.Tensor:
    """K or V rows -> a view of the same bytes as integers of the same width, for the
    byte-moving ops (scatter, equality) that torch lacks for float8 on the CPU."""
    return rows.view(BITS[rows.dtype.itemsize])


def kv_float(rows: torch.Tensor) -> torch.Tensor:
    """K or V rows in any KV dtype -> their values (..., D) (float rows as they are)."""
    return kv_codec(rows.dtype).decode(rows)
