"""Llama-family decoder (Llama 2/3/3.1, Mistral-style GQA, Qwen2 qkv bias) and Gemma 3 (norms on
queries and keys and around attention and MLP, GELU-tanh, scaled embeddings, sliding-window
layers with a RoPE of their own). The layer class per family is looked up in :data:`LAYERS`.

Parameter names are Hugging Face's except for two fused projections, one matmul each instead of
three and two (:data:`FUSED`): ``self_attn.qkv_proj`` stacks q/k/v and ``mlp.gate_up_proj``
stacks gate/up, row-wise; :func:`from_hf_state` and :func:`to_hf_state` convert state dicts.

The layers do not own a KV cache: each forward takes an ``attend`` callable that receives the
rotated queries, keys and values of one layer and returns its attention output. Prefill passes
causal attention over the prompt; decode passes attention over a fixed-shape slot cache. This keeps
one model for every cache policy.
"""

from __future__ import annotations

import re
from typing import Protocol

import torch
from torch import nn

from snapstream import kernels
from snapstream.attention import causal_attention
from snapstream.config import ModelConfig
from snapstream.rope import RotaryEmbedding

# fused projection -> the Hugging Face projections it stacks, in row order
FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
_LAYER_PARAM = re.compile(r"(model\.layers\.\d+)\.(.+)\.(weight|bias)")


def from_hf_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Hugging Face-named state dict -> this model's names (q/k/v and gate/up stacked).
    A fused projection with a part missing is left unfused, for the loader to name."""
    out = dict(state)
    prefixes = {m[1] for m in map(_LAYER_PARAM.fullmatch, state) if m}
    for prefix in prefixes:
        for fused, parts in FUSED.items():
            for kind in ("weight", "bias"):
                names = [f"{prefix}.{part}.{kind}" for part in parts]
                if all(name in out for name in names):
                    out[f"{prefix}.{fused}.{kind}"] = torch.cat([out.pop(n) for n in names])
    return out


def to_hf_state(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """This model's state dict -> Hugging Face names (the fused projections split)."""
    q_dim, kv_dim = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    sizes = {"self_attn.qkv_proj": (q_dim, kv_dim, kv_dim),
             "mlp.gate_up_proj": (config.intermediate_size,) * 2}
    out = {}
    for name, tensor in state.items():
        match = _LAYER_PARAM.fullmatch(name)
        if match is None or match[2] not in FUSED:
            out[name] = tensor
            continue
        prefix, fused, kind = match.groups()
        for part, piece in zip(FUSED[fused], tensor.split(sizes[fused]), strict=True):
            out[f"{prefix}.{part}.{kind}"] = piece
    return out


class AttendFn(Protocol):
    def __call__(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q (B, Hq, T, D), k/v (B, Hkv, T, D) -> attention output (B, Hq, T', D) of the last
        T' <= T positions: T' = T but where the caller knows that only the last positions'
        outputs are wanted (a prompt's final layer, whose other rows nothing reads); the layer
        then carries on with those rows alone."""
        ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight.to(x.dtype), self.eps)  # weight: no copy if same


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, qk_norm: bool = False) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        hidden, q_dim = config.hidden_size, config.num_heads * config.head_dim
        kv_dim = config.num_kv_heads * config.head_dim
        self.qkv_proj = nn.Linear(hidden, q_dim + 2 * kv_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_dim, hidden, bias=config.o_bias)
        if qk_norm:  # RMSNorm over each head's query and key (Gemma 3)
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        # attention runs at head_dim ** -0.5 (SDPA's and the kernels' scale): a model with
        # another query scale has its queries multiplied by the ratio
        scale = config.query_scale or config.head_dim**-0.5
        self.q_factor = scale * config.head_dim**0.5

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer_idx: int,
        attend: AttendFn,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        Hq, Hkv = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(B, T, Hq + 2 * Hkv, self.head_dim)
        q, k, v = qkv.split((Hq, Hkv, Hkv), dim=2)  # (B, T, H*, D)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q = kernels.rotary(q, cos, sin, self.q_factor)
        k = kernels.rotary(k, cos, sin, 1.0)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H*, T, D)
        out = attend(layer_idx, q, k, v)  # (B, Hq, T', D): the last T' positions
        return self.o_proj(out.transpose(1, 2).reshape(B, out.shape[2], -1))


# A long prompt's MLP runs at most this many rows at a time, so its (rows, 2 * inner)
# intermediate is bounded (16 MiB for Gemma 3 270M in bfloat16, where a 32k prompt's whole one
# is 256 MiB): a long prefill's peak memory falls and its time does not change
# (docs/benchmarks.md, "Prefill").
MLP_CHUNK_ROWS = 2048


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_up_proj = nn.Linear(hidden, 2 * inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)
        self.activation = config.hidden_act  # a name kernels.gated_activation takes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., H) -> (..., H), at most MLP_CHUNK_ROWS rows at a time in chunks of equal size
        (so none is small enough to leave the quantized layers' GEMM path)."""
        rows = x.reshape(-1, x.shape[-1])  # (N, H)
        chunks = -(-rows.shape[0] // MLP_CHUNK_ROWS)
        if chunks <= 1:
            return self._rows(x)
        out = torch.cat([self._rows(chunk) for chunk in rows.tensor_split(chunks)])  # (N, H)
        return out.view(*x.shape[:-1], out.shape[-1])

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # (..., 2 * inner): [gate | up]
        return self.down_proj(kernels.gated_activation(gate_up, self.activation))


class DecoderLayer(nn.Module):
    """Llama family: pre-norm attention and MLP."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, layer_idx: int, attend: AttendFn) -> torch.Tensor:
        """x (B, T, H) -> (B, T', H): the rows attention returned (AttendFn)."""
        attn = self.self_attn(self.input_layernorm(x), cos, sin, layer_idx, attend)
        x = x[:, x.shape[1] - attn.shape[1]:] + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class Gemma3DecoderLayer(nn.Module):
    """Gemma 3: norms before and after attention and MLP, and on queries and keys. Its norm
    weights hold Gemma's ``1 + w`` (GGUF files store them so; Hugging Face's are shifted at
    load), so one RMSNorm serves both families."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(config, qk_norm=True)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
        self.mlp = MLP(config)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)

    def forward(self, x, cos, sin, layer_idx: int, attend: AttendFn) -> torch.Tensor:
        """x (B, T, H) -> (B, T', H): the rows attention returned (AttendFn)."""
        attn = self.self_attn(self.input_layernorm(x), cos, sin, layer_idx, attend)
        x = x[:, x.shape[1] - attn.shape[1]:] + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(mlp)


LAYERS: dict[str, type[nn.Module]] = {"llama": DecoderLayer, "qwen2": DecoderLayer,
                                      "mistral": DecoderLayer, "gemma3": Gemma3DecoderLayer}


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        layer = LAYERS[config.model_type]
        self.layers = nn.ModuleList(layer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Transformer(nn.Module):
    """Causal LM with HF names (``model.layers.N...``, ``lm_head``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(config.rope, config.head_dim)
        self.local_rotary = RotaryEmbedding(config.local_rope or config.rope, config.head_dim)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """input_ids, positions (B, T) -> final normed hidden states (B, T', hidden) of the last
        T' positions (T' = T unless ``attend`` cut the final layer's rows, AttendFn), with the
        activations in ``dtype`` (None: the embedding's). A prompt of a quantized model runs in
        the CPU's GEMM dtype (its layers take any activations; on a CPU with AMX, bfloat16)."""
        x = self.model.embed_tokens(input_ids)  # (B, T, hidden)
        if dtype is not None:
            x = x.to(dtype)
        if self.config.embed_scale != 1.0:
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        sliding = set(self.config.sliding_layers)
        rotation = self.rotary(positions)  # cos, sin (B, 1, T, D) float32
        local = self.local_rotary(positions) if sliding else rotation
        for layer_idx, layer in enumerate(self.model.layers):
            x = layer(x, *(local if layer_idx in sliding else rotation), layer_idx, attend)
        return self.model.norm(x)

    def causal_attend(self, layer_idx: int, q, k, v) -> torch.Tensor:
        """Plain causal attention over the tokens of this forward (no cache), windowed on the
        sliding layers."""
        return causal_attention(q, k, v, self.config.attention_windows[layer_idx])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., hidden) -> float32 logits (..., vocab)."""
        return self.lm_head(hidden).float()

