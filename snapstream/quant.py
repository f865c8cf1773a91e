"""Weight-only quantized linear layers for CPU inference (the Engine's dtypes "int8", "int4").

Weights are requantized at load from the checkpoint's dequantized float weights: int8 with one
scale per output row (symmetric), or int4 with a scale and a zero per group of 32 inputs (the
blocks of GGUF's Q4_0/Q4_1, which it then reproduces up to the bfloat16 rounding of the scales).
The LM head is int8 in both, and a tied embedding looks its rows up there.
torch's CPU kernels (``aten._weight_int8pack_mm``, ``aten._weight_int4pack_mm_for_cpu``)
vectorize bfloat16 activations only on x86: float32 input takes a scalar loop, ~10x slower
than a float32 ``F.linear`` (torch 2.13, ``int8mm_kernel.cpp``). So each layer rounds its
input to bfloat16 for the matmul (products accumulate in float32) and returns float32; norms,
attention and residuals stay in the model's dtype.

Those kernels are matrix-vector products: they win while few rows come in (decode), and lose
to oneDNN's bfloat16 GEMM once a prompt's rows do. From ``GEMM_MIN_ROWS`` rows on, a layer
multiplies by its weight dequantized to bfloat16, made on the first such call (the kernel
applied to the identity, so it is exactly what the kernel computes with, rounded to
bfloat16) and kept outside the state dict: a decode worker never makes it, and it does not
change the model's fingerprint.
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

from snapstream.model import Transformer

MATMUL_DTYPE = torch.bfloat16  # what the kernels take as activations and scales
INT4_GROUP = 32  # inputs per int4 scale/zero; divides every hidden size of the Llama family
GEMM_MIN_ROWS = 64  # from this many input rows on, the dequantized bfloat16 GEMM is faster


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
    """weight (N, K) float -> (q (N, K) int32 in [0, 15], scale_zeros (K/group, N, 2) bfloat16)
    with weight ~= (q - 8) * scale + zero in each group (the convention of torch's kernel)."""
    N, K = weight.shape
    if K % group or N % 16:
        raise ValueError(f"int4 weights need in_features divisible by {group} and out_features "
                         f"by 16 (torch's packing), got a {N}x{K} weight")
    groups = weight.detach().float().view(N, K // group, group)  # (N, G, group)
    lo, hi = groups.amin(-1), groups.amax(-1)  # (N, G)
    scales = ((hi - lo) / 15).clamp(min=1e-12).to(MATMUL_DTYPE).float()  # (N, G)
    zeros = (lo + 8 * scales).to(MATMUL_DTYPE).float()  # (N, G)
    q = ((groups - zeros[..., None]) / scales[..., None]).add_(8).round_().clamp_(0, 15)
    scale_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1)  # (G, N, 2)
    return q.to(torch.int32).view(N, K), scale_zeros.contiguous().to(MATMUL_DTYPE)


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
        """x (M, K) bfloat16 -> (M, N) bfloat16 through the quantized weight."""
        raise NotImplementedError

    @cached_property
    def gemm_weight(self) -> torch.Tensor:
        """(N, K) bfloat16: the kernel's weight, read back through the identity."""
        identity = torch.eye(self.in_features, dtype=MATMUL_DTYPE)  # (K, K)
        return self.kernel(identity).T.contiguous()  # (N, K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., K) -> (..., N) in x's dtype."""
        flat = _flat_bf16(x)  # (M, K)
        out = F.linear(flat, self.gemm_weight) if len(flat) >= GEMM_MIN_ROWS else self.kernel(flat)
        out = out.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


class Int8Linear(QuantizedLinear):
    """``nn.Linear`` with int8 weights (N, K) and one bfloat16 scale per output row."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        q, scales = quantize_int8_rows(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", q)  # (N, K) int8
        self.register_buffer("scales", scales)  # (N,) bfloat16
        self.bias = linear.bias  # (N,) in the model's dtype, or None

    def dequantized(self) -> torch.Tensor:
        """The weight the layer computes with, (N, K) float32."""
        return self.weight.float() * self.scales.float()[:, None]

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scales)  # (M, N)


class Int4Linear(QuantizedLinear):
    """``nn.Linear`` with int4 weights in torch's packed CPU layout, a bfloat16 scale and zero
    per group of ``INT4_GROUP`` inputs."""

    def __init__(self, linear: nn.Linear, group: int = INT4_GROUP) -> None:
        super().__init__()
        q, scale_zeros = quantize_int4_groups(linear.weight, group)
        self.in_features, self.out_features, self.group = (
            linear.in_features, linear.out_features, group)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)  # (N, K/2) uint8
        self.register_buffer("weight", packed)
        self.register_buffer("scale_zeros", scale_zeros)  # (K/group, N, 2) bfloat16
        self.bias = linear.bias

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.weight, self.group, self.scale_zeros)  # (M, N)


class Int8Embedding(nn.Module):
    """The token embedding read from an int8 LM head's rows (tied weights): one copy of them."""

    def __init__(self, head: Int8Linear, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight, self.scales, self.dtype = head.weight, head.scales, dtype  # shared buffers

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (...) -> (..., hidden) in the model's dtype."""
        rows = self.weight[input_ids].float()  # (..., hidden)
        return (rows * self.scales[input_ids].float()[..., None]).to(self.dtype)


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
