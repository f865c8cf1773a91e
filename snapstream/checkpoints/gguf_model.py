"""A GGUF file's model configuration, from its metadata (torch-free), and the names and
layout of its tensors (gguf_weights.py turns them into a state dict)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from snapstream.checkpoints.gguf_file import GGUFFile
from snapstream.config import FULL, SLIDING, ModelConfig, RopeConfig

_PROJECTIONS = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
LLAMA_LAYER_TENSORS = {
    **_PROJECTIONS,
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
# llama.cpp's converter stores Gemma's norm weights as 1 + w, what snapstream's model holds
GEMMA3_LAYER_TENSORS = {
    **_PROJECTIONS,
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _no_fields(file: GGUFFile, head_dim: int) -> dict[str, Any]:
    return {}


def _gemma3_fields(file: GGUFFile, head_dim: int) -> dict[str, Any]:
    """What llama.cpp fixes for Gemma 3 instead of reading it from the file: a global layer
    after every 5 sliding ones, the sliding layers' RoPE base 10k, the query scale
    head_dim ** -0.5 (all sizes but 27B, whose query_pre_attn_scalar is hidden / heads)."""
    num_layers = file.arch_get("block_count")
    return {"hidden_act": "gelu_tanh", "query_scale": head_dim**-0.5,
            "embed_scale": file.arch_get("embedding_length") ** 0.5,
            "sliding_window": file.arch_get("attention.sliding_window"),
            "layer_types": tuple(FULL if (i + 1) % 6 == 0 else SLIDING for i in range(num_layers)),
            "local_rope": RopeConfig(theta=10000.0)}


@dataclass(frozen=True)
class Architecture:
    model_type: str
    permuted_qk: bool  # llama.cpp's converter interleaved the rotary halves of Q and K rows
    qkv_bias: bool
    layer_tensors: Mapping[str, str] = field(default_factory=lambda: LLAMA_LAYER_TENSORS)
    family_fields: Callable[[GGUFFile, int], dict[str, Any]] = _no_fields  # its own config


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(model_type="llama", permuted_qk=True, qkv_bias=False),
    "qwen2": Architecture(model_type="qwen2", permuted_qk=False, qkv_bias=True),
    "gemma3": Architecture(model_type="gemma3", permuted_qk=False, qkv_bias=False,
                           layer_tensors=GEMMA3_LAYER_TENSORS, family_fields=_gemma3_fields),
}

ROPE_FREQS = "rope_freqs.weight"  # Llama-3.1's per-frequency scaling, read into the config


def architecture_of(file: GGUFFile) -> Architecture:
    arch = file.architecture
    if arch not in ARCHITECTURES:
        raise ValueError(f"{file.path}: architecture {arch!r} is not supported "
                         f"(supported: {sorted(ARCHITECTURES)})")
    return ARCHITECTURES[arch]


def config_from_gguf(file: GGUFFile) -> ModelConfig:
    arch = architecture_of(file)
    num_heads = file.arch_get("attention.head_count")
    hidden = file.arch_get("embedding_length")
    head_dim = file.arch_get("attention.key_length", hidden // num_heads)
    return ModelConfig(
        vocab_size=file.arch_get("vocab_size", None) or len(file.get("tokenizer.ggml.tokens")),
        hidden_size=hidden,
        intermediate_size=file.arch_get("feed_forward_length"),
        num_layers=file.arch_get("block_count"),
        num_heads=num_heads,
        num_kv_heads=file.arch_get("attention.head_count_kv", num_heads),
        head_dim=head_dim,
        max_position_embeddings=file.arch_get("context_length"),
        rms_norm_eps=file.arch_get("attention.layer_norm_rms_epsilon"),
        rope=_rope(file, head_dim),
        tie_word_embeddings="output.weight" not in file.tensors,
        qkv_bias=arch.qkv_bias or "blk.0.attn_q.bias" in file.tensors,
        model_type=arch.model_type,
        **arch.family_fields(file, head_dim),
    )


def _rope(file: GGUFFile, head_dim: int) -> RopeConfig:
    scaling = file.arch_get("rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"{file.path}: rope scaling {scaling!r} is not supported")
    rotary_dims = file.arch_get("rope.dimension_count", head_dim)
    if rotary_dims != head_dim:
        raise ValueError(f"{file.path}: partial rotary ({rotary_dims} of {head_dim} dims) is "
                         "not supported")
    factors = ()
    if ROPE_FREQS in file.tensors:
        factors = tuple(float(f) for f in file.array(ROPE_FREQS))
    return RopeConfig(theta=file.arch_get("rope.freq_base", 10000.0), freq_factors=factors)


def hf_name(gguf_name: str, arch: Architecture) -> str | None:
    """The Hugging Face name of a GGUF tensor; None for tensors the model does not hold."""
    if gguf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[gguf_name]
    prefix, _, rest = gguf_name.partition(".")
    if prefix == "blk":
        layer, _, part = rest.partition(".")
        if part in arch.layer_tensors:
            return f"model.layers.{layer}.{arch.layer_tensors[part]}"
    return None
