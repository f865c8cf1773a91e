"""GGUF's quantized blocks as codes in groups, exactly: ``w = code * scale + offset`` gives
the float32 value llama.cpp (and ``gguf.quants.dequantize``) gives, for every weight.

- Q4_0, Q4_1: 4-bit codes, one group of 32 per block (scale d; offset -8d or m).
- Q4_K: 4-bit codes, 8 groups of 32 per block of 256 (scale d * sc, offset -dmin * m).
- Q5_0, Q5_1, Q8_0: 8-bit codes (q - 16, q, q), one group of 32 per block.
- Q5_K: 8-bit codes, 8 groups of 32 per block (as Q4_K, with a fifth bit).
- Q6_K: 8-bit codes q - 32, 16 groups of 16 per block (scale d * sc).

The products d * sc and dmin * m are exact in float32 (11 by 6 or 8 significant bits), and so is
code * scale, so each weight is rounded once, in the final addition, as in the reference. The
legacy types' scales and offsets are float16 values (-8d and -16d too): they are kept as such.
The K-quants also give each block's d (and -dmin) as factors, of which its scales (and offsets)
are integer multiples: the layers hold those integers as int8 codes (snapstream/quant.py).
Torch-free: numpy arrays in, numpy arrays out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import Q4_K

QK_K = 256


@dataclass(frozen=True)
class BlockCodes:
    """codes (B, block) uint8 (bits 4) or int8 (bits 8), scales (B, block/group) float32,
    offsets (B, block/group) float32 or None (all zero); K-quants: factors (B, S) float32, the
    block's d (and -dmin, S = 2) of which every scale (offset) is an integer multiple."""

    codes: np.ndarray
    scales: np.ndarray
    offsets: np.ndarray | None
    factors: np.ndarray | None = None


@dataclass(frozen=True)
class BlockType:
    bits: int  # code width: 4 or 8
    group: int  # weights per scale/offset
    decode: Callable[[np.ndarray], BlockCodes]  # (B, type_size) uint8 -> its codes


def _half(raw: np.ndarray) -> np.ndarray:
    """(B, 2) uint8 -> (B, 1) float32 from float16."""
    return raw.copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """(B, n * width/2) uint8 -> (B, n, width): for each run of width/2 bytes, its low nibbles
    then its high ones (ggml's order)."""
    B = qs.shape[0]
    runs = qs.reshape(B, -1, 1, width // 2) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (runs & np.uint8(15)).reshape(B, -1, width)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """(B, 4) uint8 holding one bit per weight -> (B, count) uint8 in {0, 1}."""
    bits = qh.copy().view(np.uint32) >> np.arange(count, dtype=np.uint32)
    return (bits & np.uint32(1)).astype(np.uint8)


def _q4_0(blocks: np.ndarray) -> BlockCodes:
    d = _half(blocks[:, :2])
    return BlockCodes(_nibbles(blocks[:, 2:], 32)[:, 0], d, -8 * d)


def _q4_1(blocks: np.ndarray) -> BlockCodes:
    return BlockCodes(_nibbles(blocks[:, 4:], 32)[:, 0], _half(blocks[:, :2]),
                      _half(blocks[:, 2:4]))


def _q5_0(blocks: np.ndarray) -> BlockCodes:
    q = _nibbles(blocks[:, 6:], 32)[:, 0] | _high_bits(blocks[:, 2:6], 32) << np.uint8(4)
    return BlockCodes((q.astype(np.int8) - np.int8(16)), _half(blocks[:, :2]), None)


def _q5_1(blocks: np.ndarray) -> BlockCodes:
    q = _nibbles(blocks[:, 8:], 32)[:, 0] | _high_bits(blocks[:, 4:8], 32) << np.uint8(4)
    return BlockCodes(q.astype(np.int8), _half(blocks[:, :2]), _half(blocks[:, 2:4]))


def _q8_0(blocks: np.ndarray) -> BlockCodes:
    return BlockCodes(blocks[:, 2:].copy().view(np.int8), _half(blocks[:, :2]), None)


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: (B, 8) scales d * sc and offsets -dmin * m of the 8 groups, and their
    factors (B, 2): d and -dmin."""
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16].copy())
    d, dmin = _half(blocks[:, :2]), _half(blocks[:, 2:4])
    return (d * sc.astype(np.float32), -(dmin * m.astype(np.float32)),
            np.concatenate([d, -dmin], axis=1))


def _q4_k(blocks: np.ndarray) -> BlockCodes:
    scales, offsets, factors = _k_scales(blocks)
    codes = _nibbles(blocks[:, 16:], 64).reshape(len(blocks), QK_K)
    return BlockCodes(codes, scales, offsets, factors)


def _q5_k(blocks: np.ndarray) -> BlockCodes:
    scales, offsets, factors = _k_scales(blocks)
    B = len(blocks)
    low = _nibbles(blocks[:, 48:], 64).reshape(B, 8, 32)
    qh = blocks[:, 16:48].reshape(B, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    codes = low | (qh & np.uint8(1)) << np.uint8(4)  # (B, 8, 32)
    return BlockCodes(codes.reshape(B, QK_K).astype(np.int8), scales, offsets, factors)


def _q6_k(blocks: np.ndarray) -> BlockCodes:
    B = len(blocks)
    low = _nibbles(blocks[:, :128], 128).reshape(B, 8, 32)  # (B, 8, 32): 4 low bits
    qh = blocks[:, 128:192].reshape(B, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(
        1, 1, 4, 1)
    high = (qh & np.uint8(3)).reshape(B, 8, 32)
    codes = (low | high << np.uint8(4)).astype(np.int8) - np.int8(32)
    sc = blocks[:, 192:208].copy().view(np.int8).astype(np.float32)  # (B, 16)
    d = _half(blocks[:, 208:210])  # (B, 1)
    return BlockCodes(codes.reshape(B, QK_K), d * sc, None, d)


BLOCK_TYPES: dict[T, BlockType] = {
    T.Q4_0: BlockType(4, 32, _q4_0),
    T.Q4_1: BlockType(4, 32, _q4_1),
    T.Q4_K: BlockType(4, 32, _q4_k),
    T.Q5_0: BlockType(8, 32, _q5_0),
    T.Q5_1: BlockType(8, 32, _q5_1),
    T.Q5_K: BlockType(8, 32, _q5_k),
    T.Q6_K: BlockType(8, 16, _q6_k),
    T.Q8_0: BlockType(8, 32, _q8_0),
}
FLOAT_TYPES = (T.F32, T.F16, T.BF16)
# read only dequantized to float32 (``gguf.quants``): their codes do not fit the kernels' groups
DEQUANTIZED_TYPES = (T.Q2_K, T.Q3_K, T.TQ1_0, T.TQ2_0, T.MXFP4, T.IQ1_S, T.IQ1_M, T.IQ2_XXS,
                     T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ4_NL, T.IQ4_XS)
READABLE_TYPES = frozenset({*FLOAT_TYPES, *BLOCK_TYPES, *DEQUANTIZED_TYPES})
SUPPORTED_TYPES = (f"as exact int4/int8 blocks {', '.join(t.name for t in BLOCK_TYPES)}; as "
                   f"float32 {', '.join(t.name for t in (*FLOAT_TYPES, *DEQUANTIZED_TYPES))}")


def decode_rows(kind: T, data: np.ndarray) -> BlockCodes:
    """data (N, bytes per row) uint8 of a tensor of ``kind`` -> codes (N, K), scales and offsets
    (N, K / group), K-quants' factors (N, K / 256, S)."""
    block_type = BLOCK_TYPES[kind]
    N = data.shape[0]
    type_size = GGML_QUANT_SIZES[kind][1]
    got = block_type.decode(np.ascontiguousarray(data).reshape(-1, type_size))
    factors = got.factors
    return BlockCodes(got.codes.reshape(N, -1), got.scales.reshape(N, -1),
                      None if got.offsets is None else got.offsets.reshape(N, -1),
                      None if factors is None else factors.reshape(N, -1, factors.shape[1]))
