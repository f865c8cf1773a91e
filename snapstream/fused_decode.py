"""The decode step's decoder layers as one compiled op each (``snapstream::decode_layer``,
snapstream/csrc/decode_layer.cpp).

A layer of quantized linears (Llama family, Qwen2 with its q/k/v biases, or Gemma 3) runs its
norms, QKV projection, RoPE,
slot attention, output projection, MLP and both residuals in C++, with the very kernels and
roundings of the module path (its result is that path's bit for bit), but without the ~20 small
torch ops per layer and the Python between them: at batch 1 on two cores those took more than
half of a step. Other layers (float weights, biases outside the QKV projection) and batches of
``GEMM_MIN_ROWS`` rows or more (whose linears run oneDNN's GEMM) take the module path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from snapstream import kernels
from snapstream.model import DecoderLayer, Gemma3DecoderLayer, Transformer
from snapstream.quant import GEMM_MIN_ROWS, INT4_X_BITS, Int4Linear, QuantizedLinear

CacheOf = Callable[[int], tuple[torch.Tensor, ...]]  # layer -> k, v, slots, empty


@dataclass(frozen=True)
class FusedLayer:
    """``decode_layer``'s arguments that do not change from step to step."""

    params: tuple[torch.Tensor, ...]  # see the op (snapstream/csrc/decode_layer.cpp)
    num_heads: int
    eps: float
    q_factor: float
    activation: str  # an activation of kernels.gated_activation: silu or gelu_tanh
    qkv_bias: torch.Tensor | None  # ((Hq + 2 Hkv) D,) float32: Qwen2's q/k/v biases
    x_bits: int  # the int4 linears' (Int4Linear.x_bits)


# per layer class: the names of its norms after the op's first 14 params (Gemma 3's extra four)
EXTRA_NORMS = {DecoderLayer: (),
               Gemma3DecoderLayer: ("self_attn.q_norm", "self_attn.k_norm",
                                    "pre_feedforward_layernorm", "post_feedforward_layernorm")}
LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
NO_FACTORS = torch.empty(0)  # a linear's factors in the op's params where its scales are floats


def _fused_layer(layer: torch.nn.Module) -> FusedLayer | None:
    if type(layer) not in EXTRA_NORMS:
        return None
    linears = [layer.get_submodule(name) for name in LINEARS]
    norms = [layer.get_submodule(name).weight.detach()
             for name in ("input_layernorm", "post_attention_layernorm",
                          *EXTRA_NORMS[type(layer)])]
    qkv_bias = linears[0].bias if isinstance(linears[0], QuantizedLinear) else None
    x_bits = {linear.x_bits for linear in linears if isinstance(linear, Int4Linear)}
    if (not all(isinstance(linear, QuantizedLinear) for linear in linears) or len(x_bits) > 1
            or any(linear.bias is not None for linear in linears[1:])
            or not all(tensor.dtype == torch.float32 and tensor.device.type == "cpu"
                       for tensor in (*norms, *(() if qkv_bias is None else (qkv_bias,))))):
        return None
    qkv, out, gate_up, down = ((linear.weight, linear.scales,
                                NO_FACTORS if linear.factors is None else linear.factors)
                               for linear in linears)
    return FusedLayer(params=(norms[0], *qkv, *out, norms[1], *gate_up, *down, *norms[2:]),
                      num_heads=layer.self_attn.num_heads, eps=layer.input_layernorm.eps,
                      q_factor=layer.self_attn.q_factor, activation=layer.mlp.activation,
                      qkv_bias=None if qkv_bias is None else qkv_bias.detach().contiguous(),
                      x_bits=x_bits.pop() if x_bits else INT4_X_BITS)


def fused_layers(model: Transformer) -> tuple[FusedLayer, ...] | None:
    """``decode_layer``'s arguments for each of ``model``'s layers, or None unless every layer
    is a Llama-family (Qwen2: q/k/v biases) or Gemma 3 one of quantized linears (int4 ones of
    one ``x_bits``), float32 norms and biases."""
    layers = tuple(_fused_layer(layer) for layer in model.model.layers)
    return None if None in layers else layers


def runs_fused(layers: tuple[FusedLayer, ...] | None, batch: int) -> bool:
    """Whether a step of ``batch`` rows takes the fused layers."""
    return layers is not None and batch < GEMM_MIN_ROWS


def fused_forward(model: Transformer, layers: tuple[FusedLayer, ...],
                  token_ids: torch.Tensor, positions: torch.Tensor,
                  cache_of: CacheOf) -> torch.Tensor:
    """token_ids, positions (B,) -> final normed hidden states (B, hidden) float32, as
    ``model(token_ids[:, None], positions[:, None], attend)[:, 0]``; ``cache_of(layer)``: the
    layer's k, v, slots and empty for ``slot_attention``."""
    x = model.model.embed_tokens(token_ids)  # (B, hidden) float32 (the norms' dtype)
    if model.config.embed_scale != 1.0:
        x = x * torch.tensor(model.config.embed_scale, dtype=x.dtype)
    sliding = set(model.config.sliding_layers)
    rotation = model.rotary(positions[:, None])  # cos, sin (B, 1, 1, D) float32
    local = model.local_rotary(positions[:, None]) if sliding else rotation
    for index, layer in enumerate(layers):
        cos, sin = local if index in sliding else rotation
        x = kernels.decode_layer(x, layer.params, cos, sin, *cache_of(index), layer.num_heads,
                                 layer.eps, layer.q_factor, layer.activation, layer.qkv_bias,
                                 layer.x_bits)
    return model.model.norm(x)
