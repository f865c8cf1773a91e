"""The project's torch ops (namespace ``snapstream``): compiled CPU kernels (snapstream/csrc,
built by setup.py) and, registered here, what runs them on other devices and under
``torch.compile`` (shapes only).

- ``slot_attention(q, k, v, k_new, v_new, slots, empty)``: writes each row's new key and value
  into its slot of the cache (in place), then one query per row attends over every slot.
- ``rms_norm(x, weight, eps)``: ``F.rms_norm`` in one pass per row.
- ``rotary(x, cos, sin, factor)``: RoPE of (B, T, H, D) heads (rope.py's ``apply_rotary``), times
  a query scale, in one pass, float32 arithmetic (cos and sin as the model makes them, float32)
  rounded once to x's dtype; the heads come out contiguous in the same (B, T, H, D) order.
- ``gated_activation(x, activation)``: a gated MLP's ``act(gate) * up`` from its [gate | up]
  projection in one pass (activation ``silu`` or ``gelu_tanh``).
- ``int4_matmul(x, weight, scales, n, factors=None, x_bits=15)``, ``int8_matmul(x, weight,
  scales, n, factors=None)``: quantized matmul (codes in groups with float16/float32 scales and
  offsets, or int8 codes of them with their float32 factors; int8 also rounds x to 8-bit codes,
  int4 to codes of ``x_bits`` (15 or 8) where ``int4_matmul_reads_codes(group)``: its integer
  kernels, AVX512-VNNI, plain AVX-512 and AVX2)
  in the blocked layout of snapstream/quant.py (CPU only, as quantization is; their shapes are
  registered for ``torch.compile``).
- ``prompt_attention(q, k, v, window, positions)``: causal attention over a prompt, GQA,
  optionally within a sliding window of positions: a flash kernel for float32 on AVX-512 CPUs
  and bfloat16 on AVX512-BF16 CPUs without AMX, where ``prompt_attention_covers(q)`` (False off
  the CPU); the model runs torch's SDPA for the rest (snapstream.attention.causal_attention).
- ``int8_rows(x)``: K/V rows (..., D) -> int8 rows (..., D + 4) with their scales; defined
  with the KV codecs that use it (snapstream/kvquant.py, which registers its off-CPU form).
- ``decode_layer(x, params, cos, sin, k, v, slots, empty, num_heads, eps, q_factor,
  activation, qkv_bias, x_bits)``: a whole decoder layer (Llama family, Qwen2's q/k/v biases, or
  Gemma 3) of quantized linears for one decode step (:mod:`snapstream.fused_decode`; CPU only).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

import snapstream._kernels  # noqa: F401  (loading it registers the CPU kernels)
from snapstream.cpu import KERNEL_CAPS
from snapstream.kvquant import kv_codec
from snapstream.rope import apply_rotary

kernel_cap = torch.ops.snapstream.kernel_cap
set_kernel_cap = torch.ops.snapstream.set_kernel_cap
isa = torch.ops.snapstream.isa
kernel_cap()  # reads $SNAPSTREAM_KERNELS now: a bad value stops the import, naming the choices


def distinct_caps() -> tuple[str, ...]:
    """The caps that give this CPU's kernels different instruction sets, highest first (each
    lower path a test can check against the others)."""
    before, seen, caps = kernel_cap(), set(), []
    try:
        for cap in KERNEL_CAPS:
            set_kernel_cap(cap)
            if (extensions := tuple(isa())) not in seen:
                seen.add(extensions)
                caps.append(cap)
    finally:
        set_kernel_cap(before)
    return tuple(caps)


def kernel_paths() -> dict[str, str]:
    """Kernel -> the path it takes on this CPU under the cap (int4/int8 for groups of 32)."""
    return dict(entry.split("=", 1) for entry in torch.ops.snapstream.kernel_paths())


slot_attention = torch.ops.snapstream.slot_attention
rms_norm = torch.ops.snapstream.rms_norm
rotary = torch.ops.snapstream.rotary
gated_activation = torch.ops.snapstream.gated_activation
int4_matmul = torch.ops.snapstream.int4_matmul
int8_matmul = torch.ops.snapstream.int8_matmul
decode_layer = torch.ops.snapstream.decode_layer
prompt_attention = torch.ops.snapstream.prompt_attention
prompt_attention_covers = torch.ops.snapstream.prompt_attention_covers


def grouped_slot_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_new: torch.Tensor,
    v_new: torch.Tensor, slots: torch.Tensor, empty: torch.Tensor,
) -> torch.Tensor:
    """``slot_attention`` off the CPU. q (B, Hq, D) float32; k, v (B, Hkv, S, W) in a KV dtype
    (:mod:`snapstream.kvquant`), updated in place; k_new, v_new (B, Hkv, D); slots (B,) int64;
    empty (B, S) bool -> (B, Hq, D) float32. A KV head's G query heads share one matmul over its
    keys (GQA without repeating them), in the cache's dtype with float32 accumulation (an int8
    cache dequantized to float32 first); the softmax in float32."""
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    codec = kv_codec(k.dtype)
    rows = torch.arange(B, device=q.device)
    k[rows, :, slots] = codec.encode(k_new)  # (B, Hkv, W) into each row's slot
    v[rows, :, slots] = codec.encode(v_new)
    keys, values = codec.decode(k), codec.decode(v)  # (B, Hkv, S, D)
    q_groups = (q * D**-0.5).view(B, Hkv, Hq // Hkv, D).to(keys.dtype)  # (B, Hkv, G, D)
    scores = torch.matmul(q_groups, keys.transpose(-1, -2)).float()  # (B, Hkv, G, S)
    probs = torch.softmax(scores.masked_fill_(empty[:, None, None], float("-inf")), dim=-1)
    out = torch.matmul(probs.to(values.dtype), values)  # (B, Hkv, G, D)
    return out.float().view(B, Hq, D)


def _prompt_attention_covers_elsewhere(q: torch.Tensor) -> bool:
    return False


def _rms_norm_elsewhere(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, weight.shape, weight, eps)


def _rotary_elsewhere(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, factor: float
                      ) -> torch.Tensor:
    rotated = apply_rotary(x.transpose(1, 2), cos, sin)  # (B, H, T, D) in x's and cos' dtype
    if factor != 1.0:
        rotated = rotated * factor
    return rotated.to(x.dtype).transpose(1, 2).contiguous()  # (B, T, H, D), rounded once


GATE_ACTIVATIONS = {"silu": F.silu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh")}


def _gated_activation_elsewhere(x: torch.Tensor, activation: str) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)  # (..., I) each
    return GATE_ACTIVATIONS[activation](gate) * up


_ELSEWHERE = torch.library.Library("snapstream", "IMPL")  # kept: it holds the registrations
_ELSEWHERE.impl("slot_attention", grouped_slot_attention, "CompositeExplicitAutograd")
_ELSEWHERE.impl("rms_norm", _rms_norm_elsewhere, "CompositeExplicitAutograd")
_ELSEWHERE.impl("rotary", _rotary_elsewhere, "CompositeExplicitAutograd")
_ELSEWHERE.impl("gated_activation", _gated_activation_elsewhere, "CompositeExplicitAutograd")
_ELSEWHERE.impl("prompt_attention_covers", _prompt_attention_covers_elsewhere,
                "CompositeExplicitAutograd")


@torch.library.register_fake("snapstream::slot_attention")
def _slot_attention_shape(q, k, v, k_new, v_new, slots, empty):
    return q.new_empty(q.shape)


@torch.library.register_fake("snapstream::prompt_attention")
def _prompt_attention_shape(q, k, v, window=0, positions=None):
    return torch.empty_like(q)


@torch.library.register_fake("snapstream::rms_norm")
def _rms_norm_shape(x, weight, eps):
    return torch.empty_like(x)


@torch.library.register_fake("snapstream::rotary")
def _rotary_shape(x, cos, sin, factor):
    return x.new_empty(x.shape)


@torch.library.register_fake("snapstream::gated_activation")
def _gated_activation_shape(x, activation):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.register_fake("snapstream::int4_matmul")
def _int4_matmul_shape(x, weight, scales, n, factors=None, x_bits=15):
    return x.new_empty((x.shape[0], n), dtype=torch.float32)


@torch.library.register_fake("snapstream::int8_matmul")
def _int8_matmul_shape(x, weight, scales, n, factors=None):
    return x.new_empty((x.shape[0], n), dtype=torch.float32)


@torch.library.register_fake("snapstream::decode_layer")
def _decode_layer_shape(x, params, cos, sin, k, v, slots, empty, num_heads, eps, q_factor,
                        activation, qkv_bias=None, x_bits=15):
    return torch.empty_like(x)
