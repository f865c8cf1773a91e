"""Quantized linear layers for CPU inference: int4 or int8 codes in groups of
inputs, each group of each output with a scale and an offset, ``w = q * scale + offset``.

Two ways in, one layer: a GGUF's blocks map onto the codes exactly (Q4_0/Q4_1/Q4_K as int4
groups of 32, Q5_0/Q5_1/Q5_K/Q8_0 as int8 groups of 32, Q6_K as int8 groups of 16;
snapstream/checkpoints/gguf_blocks.py), or float weights are requantized at load (the Engine's
dtypes "int8": one scale per output row, "int4": a scale and an offset per group of 32 from the
group's range). Scales and offsets are kept in float16 where that holds every one of them
exactly (the legacy GGUF types), as int8 codes times a float32 factor per block of 256 inputs
(the K-quants' d * sc and -dmin * m: 1.5 bytes a scale of a group of 32 instead of 4), else
float32, so a GGUF's weights are reproduced bit for bit. The LM head is int8 (a tied embedding
looks its rows up there).

The matmul is the project's kernel (``snapstream::int4_matmul``, ``int8_matmul``,
snapstream/csrc/quant_matmul.cpp), in its blocked layout packed here: each block of 16 outputs
is read once per call for every row of the input, so a decode batch reads the weights once
(torch's ``_weight_int4pack_mm_for_cpu`` unpacks them again for every row: 1.7x slower at 16
rows, docs/benchmarks.md "Kernels"). Both take the input rounded to bfloat16. int8 layers
also round it to 8 bits (codes per sub-group of up to 32 inputs with one scale each, as
llama.cpp's Q8_0 activations) and sum code products exactly in int32: widening int8 weights to
bfloat16 cost more than reading them. int4 layers, where an integer kernel takes them
(AVX512-VNNI, AVX-512, AVX2: ``int4_matmul_reads_codes``), round the input to 15-bit codes per
sub-group (``Int4Linear.x_bits``: 8 where a model's outputs hold at 8 bits, half the products)
for exact int32 sums; elsewhere (AMX, the plain loop) they sum bfloat16 products in float32.
Layers return their input's dtype: float32 in decode, the CPU's GEMM dtype in a quantized
model's prompt forward.

From ``GEMM_MIN_ROWS`` rows on (a prompt), oneDNN's GEMM is as fast or faster: a layer then
multiplies by its weight dequantized to the CPU's GEMM dtype (``snapstream.cpu.matmul_dtype_name``:
bfloat16 where the CPU multiplies it in hardware, else float32), made on the first such call and
kept outside the state dict: a decode worker never makes it, and it does not change the
model's fingerprint. That weight is kept in oneDNN's own blocked layout (``torch.ops.mkldnn``'s
prepacked linear, as torch.compile's CPU back end uses it), so no GEMM reorders it again: the
same products (bit-identical in bfloat16) in less time than ``F.linear`` with the plain
weight (docs/benchmarks.md, "Prefill").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn

from snapstream.cpu import matmul_dtype_name
from snapstream.kernels import int4_matmul, int8_matmul
from snapstream.model import Transformer

KERNEL_DTYPE = torch.bfloat16  # what the kernels take as activations
INT4_GROUP = 32  # inputs per requantized int4 scale/offset; divides every Llama hidden size
BLOCK = 16  # outputs per block of the kernels' packed layout
GEMM_MIN_ROWS = 128  # from this many input rows on, the dequantized weight's GEMM is faster
PACK_ROWS = 4096  # rows packed at a time (a multiple of BLOCK: bounds the packing's temporaries)
INT4_X_BITS = 15  # x's codes in the int4 integer kernels, unless the model chooses 8
INT4_X_BITS_CHOICES = (15, 8)


@dataclass(frozen=True)
class GroupedCodes:
    """A weight as codes in groups of ``K / G`` inputs: ``weight[n, k] = codes[n, k] *
    scales[n, k // group] + offsets[n, k // group]`` (float32 arithmetic).

    With ``factors``, each scale (s = 0) and offset (s = 1) of a row is an integer in [-128,
    127] times that row's factor for its span of K/F inputs (a GGUF K-quant's d and -dmin per
    block of 256): the layer holds those integers as int8 codes beside the factors, the same
    values in a quarter of float32's bytes."""

    codes: torch.Tensor  # (N, K) uint8 in [0, 16) for bits 4, int8 for bits 8
    scales: torch.Tensor  # (N, K/group) float32
    offsets: torch.Tensor | None  # (N, K/group) float32; None: all zero
    bits: int
    factors: torch.Tensor | None = None  # (N, F, S) float32, S = 2 with offsets; None: none

    def __post_init__(self) -> None:
        N, K = self.codes.shape
        groups = self.scales.shape[1]
        if self.scales.shape[0] != N or K % groups or (K // groups) % 2:
            raise ValueError(f"quantized weights need groups of an even number of inputs: a "
                             f"{N}x{K} weight with {groups} groups per row")
        parts = 1 if self.offsets is None else 2
        if self.factors is not None and (
                self.factors.dim() != 3 or self.factors.shape[0] != N
                or self.factors.shape[2] != parts or groups % self.factors.shape[1]):
            raise ValueError(f"factors must be (N, F, {parts}) with F dividing the {groups} "
                             f"groups of a row, got {tuple(self.factors.shape)}")

    @property
    def group(self) -> int:
        return self.codes.shape[1] // self.scales.shape[1]

    def rows(self, select: torch.Tensor | slice) -> GroupedCodes:
        """The rows ``select`` ((M,) int64, in that order, or a slice)."""
        return GroupedCodes(self.codes[select], self.scales[select],
                            None if self.offsets is None else self.offsets[select], self.bits,
                            None if self.factors is None else self.factors[select])

    def row_chunks(self, size: int) -> Iterator[GroupedCodes]:
        """The rows in runs of ``size`` (views, not copies)."""
        for start in range(0, len(self.codes), size):
            yield self.rows(slice(start, start + size))

    def regrouped(self, bits: int, group: int, with_offsets: bool) -> GroupedCodes:
        """The same weights (exactly) with wider codes, smaller groups or explicit zero
        offsets."""
        if bits < self.bits or self.group % group:
            raise ValueError(f"{self.bits}-bit codes in groups of {self.group} cannot be held "
                             f"as {bits}-bit codes in groups of {group}")
        repeat = self.group // group
        zero_offsets = with_offsets and self.offsets is None
        offsets = torch.zeros_like(self.scales) if zero_offsets else self.offsets
        factors = self.factors
        if factors is not None and zero_offsets:
            factors = torch.cat([factors, torch.zeros_like(factors)], dim=2)  # (N, F, 2)
        return GroupedCodes(
            self.codes if bits == self.bits else self.codes.to(torch.int8),
            self.scales.repeat_interleave(repeat, dim=1),
            None if offsets is None else offsets.repeat_interleave(repeat, dim=1), bits, factors)

    @staticmethod
    def stacked(parts: list[GroupedCodes]) -> GroupedCodes:
        """Row-wise concatenation (a fused projection), in the widest codes and the smallest
        groups of the parts: exact whatever the parts' formats."""
        bits, group = max(p.bits for p in parts), min(p.group for p in parts)
        with_offsets = any(p.offsets is not None for p in parts)
        same = [p.regrouped(bits, group, with_offsets) for p in parts]
        factored = (all(p.factors is not None for p in same)
                    and len({p.factors.shape[1] for p in same}) == 1)
        return GroupedCodes(torch.cat([p.codes for p in same]),
                            torch.cat([p.scales for p in same]),
                            torch.cat([p.offsets for p in same]) if with_offsets else None, bits,
                            torch.cat([p.factors for p in same]) if factored else None)


def quantize_int8_rows(weight: torch.Tensor) -> GroupedCodes:
    """weight (N, K) float -> int8 codes with one float32 scale per row (a group of K)."""
    weight = weight.detach().float()
    scales = (weight.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)  # (N, 1)
    q = (weight / scales).round_().clamp_(-127, 127)  # (N, K), one temporary
    return GroupedCodes(q.to(torch.int8), scales, None, bits=8)


def quantize_int4_groups(weight: torch.Tensor, group: int = INT4_GROUP) -> GroupedCodes:
    """weight (N, K) float -> codes in [0, 15] with a float32 scale (range / 15) and offset
    (the minimum) per group of ``group`` inputs."""
    N, K = weight.shape
    if K % group:
        raise ValueError(f"int4 weights need in_features divisible by {group}, got a {N}x{K} "
                         "weight")
    groups = weight.detach().float().view(N, K // group, group)  # (N, G, group)
    lo, hi = groups.amin(-1), groups.amax(-1)  # (N, G)
    scales = ((hi - lo) / 15).clamp(min=1e-12)  # (N, G)
    q = ((groups - lo[..., None]) / scales[..., None]).round_().clamp_(0, 15)
    return GroupedCodes(q.to(torch.uint8).view(N, K), scales, lo, bits=4)


def to_blocks(q: torch.Tensor) -> torch.Tensor:
    """q (N, K) -> (ceil(N/16), K/2, 16, 2), zero rows padding N to whole blocks: [b, p, j, t]
    is output 16b + j at input 2p + t (the kernels' layout)."""
    N, K = q.shape
    if K % 2:
        raise ValueError(f"quantized weights need an even in_features, got a {N}x{K} weight")
    padded = torch.cat([q, q.new_zeros(-N % BLOCK, K)]) if N % BLOCK else q  # (NB*16, K)
    return padded.view(-1, BLOCK, K // 2, 2).transpose(1, 2).contiguous()


def exact_dtype(values: torch.Tensor) -> torch.dtype:
    """float16 when every float32 value of ``values`` survives the round trip, else float32."""
    return torch.float16 if torch.equal(values.half().float(), values) else torch.float32


def _scale_rows(codes: GroupedCodes) -> torch.Tensor:
    """(N, G, S) float32: each group's scale and, S = 2, its offset."""
    parts = [codes.scales] if codes.offsets is None else [codes.scales, codes.offsets]
    return torch.stack(parts, dim=-1).float()


def _scale_codes(codes: GroupedCodes) -> torch.Tensor:
    """(N, G, S) int8: each group's scale and offset over its factor (exactly: checked)."""
    values = _scale_rows(codes)  # (N, G, S)
    factors = codes.factors.repeat_interleave(values.shape[1] // codes.factors.shape[1],
                                              dim=1)  # (N, G, S)
    quotients = torch.where(factors == 0, 0.0, values / factors).round_()
    if not torch.equal(quotients.clamp(-128, 127) * factors, values):
        raise ValueError("factored scales must be int8 multiples of their factors")
    return quotients.to(torch.int8)


def block_major(rows: torch.Tensor) -> torch.Tensor:
    """(N, G, S) per output row, N a multiple of 16 -> the kernels' (N/16, G, S, 16)."""
    _, G, S = rows.shape
    return rows.view(-1, BLOCK, G, S).permute(0, 2, 3, 1).contiguous()


def pack_scales(rows: torch.Tensor) -> torch.Tensor:
    """(N, G, S) scales and offsets -> ``block_major``; int8 codes as they are, floats in
    float16 where exact, else float32."""
    packed = block_major(rows)  # (NB, G, S, 16)
    return packed if packed.dtype == torch.int8 else packed.to(exact_dtype(packed))


class QuantizedLinear(nn.Module):
    """A linear layer over ``GroupedCodes``: the kernel (bfloat16 rows in) for few rows, the
    dequantized weight's GEMM for many, x's dtype out. Subclasses fix the code width."""

    bits: int

    def __init__(self, codes: GroupedCodes, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self._pack(codes.row_chunks(PACK_ROWS), len(codes.codes))
        self.bias = bias  # (N,) in the model's dtype, or None

    @classmethod
    def from_chunks(cls, chunks: Iterator[GroupedCodes], rows: int) -> QuantizedLinear:
        """A layer of ``rows`` outputs from its codes in chunks of rows (a multiple of 16 rows
        each but the last), packed as they come: a large weight (an LM head) never exists
        unpacked whole beside its packed copy."""
        layer = cls.__new__(cls)
        super(QuantizedLinear, layer).__init__()
        layer._pack(chunks, rows)
        layer.bias = None
        return layer

    def _pack(self, chunks: Iterator[GroupedCodes], rows: int) -> None:
        first = next(chunks)
        if first.bits != self.bits:
            raise ValueError(f"{type(self).__name__} holds {self.bits}-bit codes, got "
                             f"{first.bits}-bit ones")
        K, (G, S) = first.codes.shape[1], _scale_rows(first).shape[1:]
        num_blocks = -(-rows // BLOCK)
        factored = first.factors is not None
        weight = None
        # (NB*16, G, S): int8 codes of factored scales, else float32 values
        scales = torch.zeros(num_blocks * BLOCK, G, S,
                             dtype=torch.int8 if factored else torch.float32)
        factors = torch.zeros(num_blocks * BLOCK, *first.factors.shape[1:]) if factored else None
        done = 0
        for chunk in itertools.chain([first], chunks):  # one decoded chunk at a time
            if done % BLOCK:
                raise ValueError("only the last chunk of rows may fill part of a block of 16")
            if (chunk.factors is not None) != factored:
                raise ValueError("the chunks of a weight are all factored or none is")
            packed = self.pack_codes(to_blocks(chunk.codes))  # (n/16, K/2, 16[, 2])
            if weight is None:
                weight = packed.new_empty((num_blocks, *packed.shape[1:]))
            weight[done // BLOCK:done // BLOCK + len(packed)] = packed
            rows_of = slice(done, done + len(chunk.codes))
            scales[rows_of] = _scale_codes(chunk) if factored else _scale_rows(chunk)
            if factored:
                factors[rows_of] = chunk.factors
            done += len(chunk.codes)
        if done != rows:
            raise ValueError(f"{rows} rows announced, {done} given")
        self.out_features, self.in_features = rows, K
        self.register_buffer("weight", weight)
        self.register_buffer("scales", pack_scales(scales))  # (N/16, G, S, 16)
        # (N/16, F, S, 16) float32 beside int8 scale codes, else None
        self.register_buffer("factors", None if factors is None else block_major(factors))

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> QuantizedLinear:
        """``linear``'s float weight requantized (see the module's docstring)."""
        return cls(cls.requantize(linear.weight), linear.bias)

    @staticmethod
    def requantize(weight: torch.Tensor) -> GroupedCodes:
        raise NotImplementedError

    @staticmethod
    def pack_codes(pairs: torch.Tensor) -> torch.Tensor:
        """``to_blocks``'s (N/16, K/2, 16, 2) codes -> the kernel's weight buffer."""
        raise NotImplementedError

    def codes_of(self, ids: torch.Tensor) -> torch.Tensor:
        """The codes of output rows ``ids`` (...) int64, (..., K), read from the weight buffer
        (only those rows: an embedding lookup reads the LM head's rows this way)."""
        raise NotImplementedError

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        """x (M, K) bfloat16 -> (M, N) float32 through the quantized weight."""
        raise NotImplementedError

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The weight's rows ``ids`` (...) as the layer computes with them, (..., K) float32."""
        groups = self.scales.shape[1]
        q = self.codes_of(ids).float()  # (..., K)
        q = q.view(*ids.shape, groups, -1)  # (..., G, group)
        scale_offset = self.scales[ids // BLOCK, :, :, ids % BLOCK].float()  # (..., G, S)
        if self.factors is not None:
            factors = self.factors[ids // BLOCK, :, :, ids % BLOCK]  # (..., F, S)
            scale_offset = scale_offset * factors.repeat_interleave(
                groups // factors.shape[-2], dim=-2)  # (..., G, S)
        out = q * scale_offset[..., 0:1]
        if scale_offset.shape[-1] == 2:
            out = out + scale_offset[..., 1:2]
        return out.view(*ids.shape, -1)

    def dequantized(self) -> torch.Tensor:
        """The weight the layer computes with, (N, K) float32."""
        return self.rows(torch.arange(self.out_features))

    @cached_property
    def gemm_weight(self) -> torch.Tensor:
        """(N, K) in the CPU's GEMM dtype, packed for oneDNN's GEMM (an opaque ``_mkldnn``
        tensor) where oneDNN packs that dtype on this CPU (bfloat16 needs AVX-512 BW/VL/DQ or
        AVX-NE-CONVERT; forced on another CPU, it stays a plain tensor): the dequantized weight,
        made in chunks of rows (an LM head's float32 copy would be 4x the layer in bfloat16)."""
        dtype = getattr(torch, matmul_dtype_name())
        ids = torch.arange(self.out_features)
        plain = torch.cat([self.rows(chunk).to(dtype) for chunk in ids.split(4096)])  # (N, K)
        if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return plain
        return torch.ops.mkldnn._reorder_linear_weight(plain)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., K) -> (..., N) in x's dtype."""
        flat = x.reshape(-1, x.shape[-1])  # (M, K)
        if len(flat) >= GEMM_MIN_ROWS:
            weight = self.gemm_weight
            flat = flat.to(weight.dtype)
            out = (torch.ops.mkldnn._linear_pointwise(flat, weight, None, "none", [], "")
                   if weight.is_mkldnn else F.linear(flat, weight))
        else:
            out = self.kernel(flat.to(KERNEL_DTYPE).contiguous())
        out = out.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias.to(out.dtype)


class Int8Linear(QuantizedLinear):
    """int8 codes, held biased (128 + q) in runs of 4 inputs, the kernel's layout; requantized
    from floats with one scale per output row."""

    bits = 8
    requantize = staticmethod(quantize_int8_rows)

    @staticmethod
    def pack_codes(pairs: torch.Tensor) -> torch.Tensor:
        NB, half, _, _ = pairs.shape
        if half % 2:
            raise ValueError(f"int8 weights need in_features divisible by 4, got {2 * half}")
        quads = pairs.view(NB, half // 2, 2, BLOCK, 2).transpose(2, 3)  # (NB, K/4, 16, 2, 2)
        return quads.reshape(NB, half // 2, BLOCK, 4).view(torch.uint8) ^ 128  # (NB, K/4, 16, 4)

    def codes_of(self, ids: torch.Tensor) -> torch.Tensor:
        quads = self.weight[ids // BLOCK, :, ids % BLOCK]  # (..., K/4, 4) biased
        return (quads ^ 128).view(torch.int8).reshape(*ids.shape, -1)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        return int8_matmul(x, self.weight, self.scales, self.out_features, self.factors)


class Int4Linear(QuantizedLinear):
    """int4 codes, two to a byte; requantized from floats in groups of ``INT4_GROUP``.
    ``x_bits``: the width of x's codes where the kernel multiplies in integers (15, or 8 for a
    model whose outputs hold at 8: :func:`use_int4_x_bits`)."""

    bits = 4
    requantize = staticmethod(quantize_int4_groups)
    x_bits = INT4_X_BITS

    @staticmethod
    def pack_codes(pairs: torch.Tensor) -> torch.Tensor:
        return pairs[..., 0] | pairs[..., 1] << 4  # (N/16, K/2, 16) uint8

    def codes_of(self, ids: torch.Tensor) -> torch.Tensor:
        pairs = self.weight[ids // BLOCK, :, ids % BLOCK]  # (..., K/2)
        return torch.stack([pairs & 15, pairs >> 4], dim=-1).reshape(*ids.shape, -1)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        return int4_matmul(x, self.weight, self.scales, self.out_features, self.factors,
                           self.x_bits)


QUANTIZED_LINEARS: dict[int, type[QuantizedLinear]] = {8: Int8Linear, 4: Int4Linear}


def quantized_linear(codes: GroupedCodes, bias: torch.Tensor | None = None) -> QuantizedLinear:
    """The layer for ``codes``' width."""
    return QUANTIZED_LINEARS[codes.bits](codes, bias)


class QuantizedEmbedding(nn.Module):
    """The token embedding read from the rows of a quantized table: the LM head's (tied
    weights: one copy of them, registered by the head) or, with ``owns``, a table of its own
    (a GGUF's untied quantized ``token_embd``), registered here as ``table``."""

    def __init__(self, table: QuantizedLinear, dtype: torch.dtype, owns: bool = False) -> None:
        super().__init__()
        if owns:
            self.table = table
        self.rows, self.dtype = table.rows, dtype  # the table's buffers, not a second copy

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (...) -> (..., hidden) in the model's dtype."""
        return self.rows(input_ids).to(self.dtype)


@dataclass(frozen=True)
class QuantScheme:
    layers: Callable[[nn.Linear], nn.Module]  # q/k/v/o and the MLP of every block
    head: Callable[[nn.Linear], QuantizedLinear]  # int8 in every scheme


QUANT_SCHEMES = {
    "int8": QuantScheme(layers=Int8Linear.from_linear, head=Int8Linear.from_linear),
    "int4": QuantScheme(layers=Int4Linear.from_linear, head=Int8Linear.from_linear),
}


def quantize_model(model: Transformer, scheme: QuantScheme) -> Transformer:
    """Replace ``model``'s linear layers in place (the float weights are freed)."""
    if model.lm_head.weight.device.type != "cpu":
        raise ValueError("quantized weights run on torch's CPU kernels: load on device 'cpu'")
    dtype = model.model.norm.weight.dtype
    for layer in model.model.layers:
        for block in (layer.self_attn, layer.mlp):
            for name, child in list(block.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(block, name, scheme.layers(child))
    model.lm_head = scheme.head(model.lm_head)
    if model.config.tie_word_embeddings:
        model.model.embed_tokens = QuantizedEmbedding(model.lm_head, dtype)
    return_freed_memory()
    return model


def use_int4_x_bits(model: nn.Module, bits: int) -> None:
    """Every int4 layer of ``model`` takes x in codes of ``bits`` (15 or 8) where its kernel
    multiplies in integers."""
    if bits not in INT4_X_BITS_CHOICES:
        raise ValueError(f"int4 layers take x in codes of {INT4_X_BITS_CHOICES} bits, not {bits}")
    for module in model.modules():
        if isinstance(module, Int4Linear):
            module.x_bits = bits


def return_freed_memory() -> None:
    """Give the freed float weights back to the OS: glibc keeps freed heap pages mapped (the
    process stays at its float32 RSS) until malloc_trim. A no-op without glibc."""
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    if trim is not None:
        trim(0)
