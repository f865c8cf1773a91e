"""The decode step's decoder layers as one compiled op each (``snapstream::decode_layer``,
snapstream/csrc/decode_layer.cpp).

A Llama-family layer of quantized linears runs its norms, QKV projection, RoPE, slot
attention, output projection, MLP and both residuals in C++, with the very kernels and
roundings of the module path (its result is that path's bit for bit), but without the ~20 small
torch ops per layer and the Python between them: at batch 1 on two cores those took more than
half of a step. Other layers (Gemma 3's, float weights, biases) and batches of
``GEMM_MIN_ROWS`` rows or more (whose linears run oneDNN's GEMM) take the module path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from snapstream import kernels
from snapstream.model import DecoderLayer, Transformer
from snapstream.quant import GEMM_MIN_ROWS, QuantizedLinear

CacheOf = Callable[[int], tuple[torch.Tensor, ...]]  # layer -> k, v, slots, empty


@dataclass(frozen=True)
class FusedLayer:
    """``decode_layer``'s arguments that do not change from step to step."""

    params: tuple[torch.Tensor, ...]  # input norm, QKV, output, post norm, gate/up, down
    num_heads: int
    eps: float
    q_factor: float


def _fusable(layer: torch.nn.Module) -> bool:
    if type(layer) is not DecoderLayer or layer.mlp.act is not F.silu:
        return False
    linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
               layer.mlp.down_proj)
    norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
    return (all(isinstance(linear, QuantizedLinear) and linear.bias is None
                for linear in linears)
            and all(norm.dtype == torch.float32 and norm.device.type == "cpu"
                    for norm in norms))


def fused_layers(model: Transformer) -> tuple[FusedLayer, ...] | None:
    """``decode_layer``'s arguments for each of ``model``'s layers, or None unless every layer
    is a Llama-family one (SiLU MLP) of quantized linears without biases, float32 norms."""
    layers = model.model.layers
    if not all(_fusable(layer) for layer in layers):
        return None
    return tuple(
        FusedLayer(
            params=(layer.input_layernorm.weight.detach(),
                    *(tensor for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj)
                      for tensor in (linear.weight, linear.scales)),
                    layer.post_attention_layernorm.weight.detach(),
                    *(tensor for linear in (layer.mlp.gate_up_proj, layer.mlp.down_proj)
                      for tensor in (linear.weight, linear.scales))),
            num_heads=layer.self_attn.num_heads, eps=layer.input_layernorm.eps,
            q_factor=layer.self_attn.q_factor)
        for layer in layers)


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
    rotation = model.rotary(positions[:, None], x.dtype)  # cos, sin (B, 1, 1, D)
    local = model.local_rotary(positions[:, None], x.dtype) if sliding else rotation
    for index, layer in enumerate(layers):
        cos, sin = local if index in sliding else rotation
        x = kernels.decode_layer(x, layer.params, cos, sin, *cache_of(index), layer.num_heads,
                                 layer.eps, layer.q_factor)
    return model.model.norm(x)
