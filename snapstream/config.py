"""Model configuration read from a Hugging Face ``config.json`` (Llama family, Qwen2, Gemma 3).

Gemma 3 differs from the Llama family in fields, not in structure: GELU-tanh MLP, a query scale
of its own, embeddings scaled by sqrt(hidden), and sliding-window layers (``layer_types``) with
their own RoPE base (``local_rope``); its extra norms are the model's (snapstream/model.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "mistral": "MistralForCausalLM", "gemma3": "Gemma3ForCausalLM"}
# config.json's model_type -> ours (transformers calls Gemma 3's text model gemma3_text)
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "mistral": "mistral", "gemma3_text": "gemma3"}
SUPPORTED_MODEL_TYPES = tuple(MODEL_TYPES)
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters; ``rope_type`` is ``default`` or ``llama3``. ``freq_factors``
    (one per frequency, as GGUF files store Llama-3.1's scaling) divide the inverse frequencies."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    freq_factors: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.rope_type not in ("default", "llama3"):
            raise ValueError(f"rope_type: unsupported {self.rope_type!r} (use default or llama3)")
        if self.theta <= 0:
            raise ValueError(f"rope_theta must be positive, got {self.theta}")


# what config.json must give; everything else has a default
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    model_type: str = "llama"
    hidden_act: str = "silu"  # silu or gelu_tanh, on the MLP's gate
    query_scale: float | None = None  # attention score scale; None: head_dim ** -0.5
    embed_scale: float = 1.0  # token embeddings are multiplied by it (Gemma: sqrt(hidden))
    sliding_window: int | None = None  # keys a sliding layer's query sees, its own included
    layer_types: tuple[str, ...] = ()  # FULL or SLIDING per layer; empty: every layer FULL
    local_rope: RopeConfig | None = None  # the sliding layers' RoPE; None: ``rope``

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"hidden_act must be silu or gelu_tanh, got {self.hidden_act!r}")
        if self.layer_types and (len(self.layer_types) != self.num_layers
                                 or set(self.layer_types) - {FULL, SLIDING}):
            raise ValueError(f"layer_types must give {FULL} or {SLIDING} for each of the "
                             f"{self.num_layers} layers, got {self.layer_types}")
        if self.sliding_layers and not (self.sliding_window or 0) >= 1:
            raise ValueError(f"sliding layers need a sliding_window >= 1, got "
                             f"{self.sliding_window}")

    @property
    def attention_windows(self) -> tuple[int | None, ...]:
        """Per layer, how many keys (its own included) a query sees; None: every earlier one."""
        sliding = set(self.sliding_layers)
        return tuple(self.sliding_window if i in sliding else None
                     for i in range(self.num_layers))

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        """Indices of the sliding-window layers (none for the Llama family)."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == SLIDING)

    @property
    def num_groups(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        model_type = MODEL_TYPES.get(raw.get("model_type", "llama"))
        if model_type is None:
            raise ValueError(f"model_type {raw.get('model_type')!r} is not supported (use one "
                             f"of {SUPPORTED_MODEL_TYPES})")
        activation = raw.get("hidden_act") or raw.get("hidden_activation") or "silu"
        if activation not in ACTIVATIONS:
            raise ValueError(f"hidden_act {activation!r} is not supported "
                             f"(use one of {sorted(ACTIVATIONS)})")
        for name in ("final_logit_softcapping", "attn_logit_softcapping"):
            if raw.get(name) is not None:
                raise ValueError(f"{name} is not supported (got {raw[name]})")
        if missing := [key for key in REQUIRED_KEYS if key not in raw]:
            raise ValueError(f"config.json lacks {', '.join(missing)}: a model config needs "
                             f"{', '.join(REQUIRED_KEYS)}")
        num_heads = raw["num_attention_heads"]
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope=_rope_from_dict(raw, 1_000_000.0 if model_type == "gemma3" else 10000.0),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", model_type == "gemma3")),
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            model_type=model_type,
            hidden_act=ACTIVATIONS[activation],
            **(_gemma3_fields(raw) if model_type == "gemma3" else {}),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """This config as a Hugging Face config.json mapping (``from_dict`` reads it back)."""
        rope: dict[str, Any] = {"rope_type": self.rope.rope_type, "rope_theta": self.rope.theta}
        if self.rope.rope_type == "llama3":
            rope.update(factor=self.rope.factor, low_freq_factor=self.rope.low_freq_factor,
                        high_freq_factor=self.rope.high_freq_factor,
                        original_max_position_embeddings=self.rope.original_max_position_embeddings)
        hf_type = next(k for k, v in MODEL_TYPES.items() if v == self.model_type)
        hf_act = next(k for k, v in ACTIVATIONS.items() if v == self.hidden_act)
        extra: dict[str, Any] = {}
        if self.model_type == "gemma3":
            local = self.local_rope or self.rope
            scalar = (self.query_scale or self.head_dim ** -0.5) ** -2
            # an integer in Gemma 3's own configs, and transformers >= 5.5 checks its type
            scalar = round(scalar) if abs(scalar - round(scalar)) < 1e-6 else scalar
            extra = {"query_pre_attn_scalar": scalar,
                     "sliding_window": self.sliding_window, "layer_types": list(self.layer_types),
                     "rope_parameters": {FULL: rope, SLIDING: {"rope_type": "default",
                                                               "rope_theta": local.theta}}}
        return {
            "architectures": [ARCHITECTURES[self.model_type]], "model_type": hf_type,
            "hidden_act": hf_act, "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope.theta,
            "rope_parameters": rope, "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.o_bias, "mlp_bias": self.mlp_bias, **extra,
        }

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _gemma3_fields(raw: dict[str, Any]) -> dict[str, Any]:
    num_layers, pattern = raw["num_hidden_layers"], raw.get("sliding_window_pattern", 6)
    layer_types = raw.get("layer_types") or [
        FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)]
    local = (raw.get("rope_parameters") or {}).get(SLIDING) or {}
    return {"query_scale": raw.get("query_pre_attn_scalar", 256) ** -0.5,
            "embed_scale": raw["hidden_size"] ** 0.5,
            "sliding_window": raw.get("sliding_window", 4096),
            "layer_types": tuple(layer_types),
            "local_rope": RopeConfig(theta=local.get(
                "rope_theta", raw.get("rope_local_base_freq", 10000.0)))}


def _rope_from_dict(raw: dict[str, Any], default_theta: float) -> RopeConfig:
    """Reads both the transformers-5 ``rope_parameters`` and the older ``rope_scaling``; Gemma 3
    keeps its global layers' under ``full_attention``."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    params = dict(params.get(FULL, params))
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", raw.get("rope_theta", default_theta))
    if rope_type == "default":
        return RopeConfig(theta=theta)
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=params["factor"],
        low_freq_factor=params.get("low_freq_factor", 1.0),
        high_freq_factor=params.get("high_freq_factor", 4.0),
        original_max_position_embeddings=params.get("original_max_position_embeddings", 8192),
    )
