"""Weight-only quantized linear layers for CPU inference (the Engine's dtypes "int8", "int4").

Weights are requantized at load from the checkpoint's dequantized float weights: int8 with one
scale per output row (symmetric), or int4 with a scale and a zero per group of 32 inputs (the
blocks of GGUF's Q4_0/Q4_1, which it then reproduces up to the bfloat16 rounding of the scales).
The LM head is int8 in both, and a tied embedding looks its rows up there.

The matmul is the project's kernel (``snapstream::int4_matmul``, ``int8_matmul``,
snapstream/csrc/quant_matmul.cpp), in its blocked layout packed here: each block of 16 outputs
is read and unpacked once per call for every row of the input (rounded to bfloat16, products
summed in float32), so a decode batch reads the weights once (torch's
``_weight_int4pack_mm_for_cpu`` unpacks them again for every row: 1.7x slower at 16 rows,
docs/benchmarks.md "Quantized matmul kernels"). Layers return float32; norms, attention and
residuals stay in the model's dtype.

From ``GEMM_MIN_ROWS`` rows on (a prompt), oneDNN's bfloat16 GEMM is as fast or faster: a layer
then multiplies by its weight dequantized to bfloat16, made on the first such call (the kernel
applied to the identity, so it is the weight the kernel computes with, rounded to bfloat16)
and kept outside the state dict: a decode worker never makes it, and it does not change the
model's fingerprint.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn

from snapstream.kernels import int4_matmul, int8_matmul
from snapstream.model import Transformer

MATMUL_DTYPE = torch.bfloat16  # what the kernels take as activations and scales
INT4_GROUP = 32  # inputs per int4 scale/zero; divides every hidden size of the Llama family
BLOCK = 16  # outputs per block of the kernels' packed layout
GEMM_MIN_ROWS = 128  # from this many input rows on, the dequantized bfloat16 GEMM is faster


def quantize_int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (N, K) float -> int8 (N, K), scales (N,) bfloat16 with weight ~= int8 * scale.

    The scales are rounded to bfloat16 before the weights are divided by them, so that the
    rounding of the scales is not an error on top of the int8 rounding."""
    weight = weight.detach().float()
    scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12).to(MATMUL_DTYPE)  # (N,)
    q = (weight / scales.float()[:, None]).round_().clamp_(-127, 127)  # (N, K), one temporary
    return q.to(torch.int8), scales


def quantize_int4_groups(weight: torch.Tensor, group: int = INT4_GROUP
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (N, K) float -> (q (N, K) uint8 in [0, 15], scale_zeros (K/group, N, 2) bfloat16)
    with weight ~= (q - 8) * scale + zero in each group."""
    N, K = weight.shape
    if K % group:
        raise ValueError(f"int4 weights need in_features divisible by {group}, got a {N}x{K} "
                         "weight")
    groups = weight.detach().float().view(N, K // group, group)  # (N, G, group)
    lo, hi = groups.amin(-1), groups.amax(-1)  # (N, G)
    scales = ((hi - lo) / 15).clamp(min=1e-12).to(MATMUL_DTYPE).float()  # (N, G)
    zeros = (lo + 8 * scales).to(MATMUL_DTYPE).float()  # (N, G)
    q = ((groups - zeros[..., None]) / scales[..., None]).add_(8).round_().clamp_(0, 15)
    scale_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1)  # (G, N, 2)
    return q.to(torch.uint8).view(N, K), scale_zeros.contiguous().to(MATMUL_DTYPE)


def to_blocks(q: torch.Tensor) -> torch.Tensor:
    """q (N, K) -> (ceil(N/16), K/2, 16, 2), zero rows padding N to whole blocks: [b, p, j, t]
    is output 16b + j at input 2p + t (the kernels' layout)."""
    N, K = q.shape
    if K % 2:
        raise ValueError(f"quantized weights need an even in_features, got a {N}x{K} weight")
    padded = torch.cat([q, q.new_zeros(-N % BLOCK, K)])  # (NB*16, K)
    return padded.view(-1, BLOCK, K // 2, 2).transpose(1, 2).contiguous()


def from_blocks(blocks: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``to_blocks``'s input rows back: rows (...) int64 -> (..., K)."""
    picked = blocks[rows // BLOCK, :, rows % BLOCK]  # (..., K/2, 2)
    return picked.reshape(*rows.shape, -1)


def _flat_bf16(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) -> (M, K) contiguous bfloat16, M = the product of the leading dims."""
    return x.reshape(-1, x.shape[-1]).to(MATMUL_DTYPE).contiguous()


class QuantizedLinear(nn.Module):
    """What the int8 and int4 layers share: bfloat16 rows in, the kernel for few rows, the
    dequantized GEMM for many, x's dtype out."""

    in_features: int
    out_features: int
    bias: torch.Tensor | None

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        """x (M, K) bfloat16 -> (M, N) float32 through the quantized weight."""
        raise NotImplementedError

    @cached_property
    def gemm_weight(self) -> torch.Tensor:
        """(N, K) bfloat16: the kernel's weight, read back through the identity."""
        identity = torch.eye(self.in_features, dtype=MATMUL_DTYPE)  # (K, K)
        return self.kernel(identity).T.to(MATMUL_DTYPE).contiguous()  # (N, K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., K) -> (..., N) in x's dtype."""
        flat = _flat_bf16(x)  # (M, K)
        out = F.linear(flat, self.gemm_weight) if len(flat) >= GEMM_MIN_ROWS else self.kernel(flat)
        out = out.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


class Int8Linear(QuantizedLinear):
    """``nn.Linear`` with int8 weights and one bfloat16 scale per output row."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        q, scales = quantize_int8_rows(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", to_blocks(q))  # (N/16, K/2, 16, 2) int8
        self.register_buffer("scales", torch.cat(
            [scales, scales.new_zeros(-len(scales) % BLOCK)]))  # (N/16 * 16,) bfloat16
        self.bias = linear.bias  # (N,) in the model's dtype, or None

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The weight's rows ``ids`` (...) as floats, (..., K) float32."""
        return from_blocks(self.weight, ids).float() * self.scales[ids].float()[..., None]

    def dequantized(self) -> torch.Tensor:
        """The weight the layer computes with, (N, K) float32."""
        return self.rows(torch.arange(self.out_features))

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        return int8_matmul(x, self.weight, self.scales, self.out_features)


class Int4Linear(QuantizedLinear):
    """``nn.Linear`` with int4 weights, a bfloat16 scale and zero per group of ``INT4_GROUP``
    inputs."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        q, scale_zeros = quantize_int4_groups(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        pairs = to_blocks(q)  # (N/16, K/2, 16, 2) in [0, 15]
        self.register_buffer("weight", pairs[..., 0] | pairs[..., 1] << 4)  # (N/16, K/2, 16)
        G, N = scale_zeros.shape[:2]
        padded = torch.cat([scale_zeros, scale_zeros.new_zeros(G, -N % BLOCK, 2)], dim=1)
        self.register_buffer("scale_zeros", padded.view(G, -1, BLOCK, 2).permute(1, 0, 3, 2)
                             .contiguous())  # (N/16, K/group, 2, 16) bfloat16
        self.bias = linear.bias

    def dequantized(self) -> torch.Tensor:
        """The weight the layer computes with, (N, K) float32."""
        N, K = self.out_features, self.in_features
        pairs = torch.stack([self.weight & 15, self.weight >> 4], dim=-1)  # (N/16, K/2, 16, 2)
        q = from_blocks(pairs, torch.arange(N)).float().view(N, -1, INT4_GROUP)  # (N, G, group)
        scales, zeros = self.scale_zeros.permute(0, 3, 1, 2).reshape(-1, K // INT4_GROUP, 2)[
            :N].float().unbind(-1)  # (N, G) each
        return ((q - 8) * scales[..., None] + zeros[..., None]).view(N, K)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        return int4_matmul(x, self.weight, self.scale_zeros, self.out_features)


class Int8Embedding(nn.Module):
    """The token embedding read from an int8 LM head's rows (tied weights): one copy of them."""

    def __init__(self, head: Int8Linear, dtype: torch.dtype) -> None:
        super().__init__()
        self.rows, self.dtype = head.rows, dtype  # the head's buffers, not a second copy

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (...) -> (..., hidden) in the model's dtype."""
        return self.rows(input_ids).to(self.dtype)


@dataclass(frozen=True)
class QuantScheme:
    layers: Callable[[nn.Linear], nn.Module]  # q/k/v/o and the MLP of every block
    head: Callable[[nn.Linear], Int8Linear]  # int8 in every scheme: the tied embedding reads it


QUANT_SCHEMES = {
    "int8": QuantScheme(layers=Int8Linear, head=Int8Linear),
    "int4": QuantScheme(layers=Int4Linear, head=Int8Linear),
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
        model.model.embed_tokens = Int8Embedding(model.lm_head, dtype)
    _return_freed_memory()
    return model


def _return_freed_memory() -> None:
    """Give the freed float weights back to the OS: glibc keeps freed heap pages mapped (the
    process stays at its float32 RSS) until malloc_trim. A no-op without glibc."""
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    if trim is not None:
        trim(0)
