"""Build a ModelSpec from a Hugging Face config.json (no torch, no transformers).

``load_model_spec`` accepts a shipped target name (``hwsim/targets/<name>.json``), a path to a
config.json, or a checkpoint directory that contains one. Parsers are looked up by the
config's ``model_type``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwsim.model_spec import DenseFfn, GqaAttention, LayerGroup, MlaAttention, ModelSpec, MoeFfn

TARGETS_DIR = Path(__file__).parent / "targets"

Config = dict[str, Any]


def _field(config: Config, key: str) -> Any:
    try:
        return config[key]
    except KeyError:
        raise ValueError(f"config.json: missing required field {key!r}") from None


def _parse_llama(name: str, config: Config) -> ModelSpec:
    hidden = _field(config, "hidden_size")
    n_heads = _field(config, "num_attention_heads")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ValueError("config.json: attention_bias/mlp_bias are not modelled; set them false")
    attention = GqaAttention(
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=config.get("num_key_value_heads") or n_heads,
        head_dim=config.get("head_dim") or hidden // n_heads,
    )
    ffn = DenseFfn(hidden_size=hidden, intermediate_size=_field(config, "intermediate_size"))
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        vocab_size=_field(config, "vocab_size"),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention=attention,
        layer_groups=(LayerGroup(count=_field(config, "num_hidden_layers"), ffn=ffn),),
    )


def _deepseek_layer_groups(config: Config) -> tuple[LayerGroup, ...]:
    hidden = _field(config, "hidden_size")
    n_layers = _field(config, "num_hidden_layers")
    n_dense = min(config.get("first_k_dense_replace", 0), n_layers)
    if config.get("moe_layer_freq", 1) != 1:
        raise ValueError("config.json: moe_layer_freq other than 1 is not modelled")
    moe = MoeFfn(
        hidden_size=hidden,
        expert_intermediate_size=_field(config, "moe_intermediate_size"),
        n_routed=_field(config, "n_routed_experts"),
        n_shared=config.get("n_shared_experts") or 0,
        top_k=_field(config, "num_experts_per_tok"),
    )
    dense = DenseFfn(hidden_size=hidden, intermediate_size=_field(config, "intermediate_size"))
    groups = (LayerGroup(n_dense, dense),) if n_dense else ()
    return groups + ((LayerGroup(n_layers - n_dense, moe),) if n_layers > n_dense else ())


def _parse_deepseek(name: str, config: Config) -> ModelSpec:
    hidden = _field(config, "hidden_size")
    attention = MlaAttention(
        hidden_size=hidden,
        n_heads=_field(config, "num_attention_heads"),
        q_lora_rank=config.get("q_lora_rank"),
        kv_lora_rank=_field(config, "kv_lora_rank"),
        qk_nope_head_dim=_field(config, "qk_nope_head_dim"),
        qk_rope_head_dim=_field(config, "qk_rope_head_dim"),
        v_head_dim=_field(config, "v_head_dim"),
    )
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        vocab_size=_field(config, "vocab_size"),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention=attention,
        layer_groups=_deepseek_layer_groups(config),
    )


def _gemma3_layer_groups(config: Config) -> tuple[LayerGroup, ...]:
    """Runs of consecutive layers of one kind: ``layer_types`` (or every
    ``sliding_window_pattern``-th layer global, Gemma 3's older key), sliding ones windowed."""
    n_layers, pattern = _field(config, "num_hidden_layers"), config.get("sliding_window_pattern", 6)
    kinds = config.get("layer_types") or [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
        for i in range(n_layers)]
    if len(kinds) != n_layers or set(kinds) - {"full_attention", "sliding_attention"}:
        raise ValueError(f"config.json: layer_types must name full_attention or "
                         f"sliding_attention for each of the {n_layers} layers")
    window = _field(config, "sliding_window")
    ffn = DenseFfn(hidden_size=_field(config, "hidden_size"),
                   intermediate_size=_field(config, "intermediate_size"))  # gated GELU: 3 mats
    groups: list[LayerGroup] = []
    for kind in kinds:
        layer_window = window if kind == "sliding_attention" else None
        if groups and groups[-1].window == layer_window:
            groups[-1] = LayerGroup(groups[-1].count + 1, ffn, layer_window)
        else:
            groups.append(LayerGroup(1, ffn, layer_window))
    return tuple(groups)


def _parse_gemma3(name: str, config: Config) -> ModelSpec:
    """Gemma 3: GQA (q/k norms are not modelled: a few hundred FLOPs a token), five
    sliding-window layers per global one."""
    spec = _parse_llama(name, {**config, "attention_bias": False, "mlp_bias": False})
    return ModelSpec(name=name, hidden_size=spec.hidden_size, vocab_size=spec.vocab_size,
                     tie_embeddings=bool(config.get("tie_word_embeddings", True)),
                     attention=spec.attention, layer_groups=_gemma3_layer_groups(config))


def _parse_qwen2(name: str, config: Config) -> ModelSpec:
    """Qwen2: the Llama family with Q/K/V biases, which are not modelled ((Hq + 2 Hkv) * D
    additions a token per layer: 2,048 for Qwen2.5-Coder-1.5B). Its optional sliding-window
    layers (``use_sliding_window``) are not modelled either."""
    if config.get("use_sliding_window"):
        raise ValueError("config.json: use_sliding_window is not modelled for qwen2; set it "
                         "false")
    return _parse_llama(name, {**config, "attention_bias": False})


PARSERS: dict[str, Callable[[str, Config], ModelSpec]] = {
    "gemma3": _parse_gemma3,
    "gemma3_text": _parse_gemma3,
    "llama": _parse_llama,
    "mistral": _parse_llama,
    "qwen2": _parse_qwen2,
    "deepseek_v2": _parse_deepseek,
    "deepseek_v3": _parse_deepseek,
}


def target_names() -> list[str]:
    return sorted(path.stem for path in TARGETS_DIR.glob("*.json"))


def _resolve(source: str) -> tuple[str, Path]:
    """The display name and config.json path that ``source`` names."""
    shipped = TARGETS_DIR / f"{source}.json"
    if "/" not in source and shipped.is_file():
        return source, shipped
    path = Path(source)
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve().name, path / "config.json"
    if path.is_file():
        return path.resolve().parent.name if path.name == "config.json" else path.stem, path
    raise ValueError(
        f"model: {source!r} is not a shipped target ({', '.join(target_names())}), "
        "a config.json file or a checkpoint directory containing config.json"
    )


def parse_config(name: str, config: Config) -> ModelSpec:
    """The ModelSpec of an already-decoded config.json mapping."""
    model_type = config.get("model_type")
    parser = PARSERS.get(model_type)
    if parser is None:
        raise ValueError(
            f"config.json: model_type {model_type!r} is not supported; "
            f"supported: {', '.join(sorted(PARSERS))}"
        )
    try:
        return parser(name, config)
    except TypeError as exc:  # a field of the wrong JSON type, e.g. a string size
        raise ValueError(f"config.json: a field has the wrong type ({exc})") from None


def load_model_spec(source: str) -> ModelSpec:
    name, path = _resolve(source)
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"model: {path} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"model: {path} must hold a JSON object")
    return parse_config(name, config)
