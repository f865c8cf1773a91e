"""Write a model as a Hugging Face checkpoint directory (config.json + model.safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from snapstream.model import Transformer
from snapstream.policy import POLICY_FILE
from snapstream.tokenizer import ByteTokenizer


def hf_config_dict(model: Transformer) -> dict:
    config = model.config
    rope = {"rope_type": config.rope.rope_type, "rope_theta": config.rope.theta}
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope.theta,
        "rope_parameters": rope, "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.qkv_bias, "mlp_bias": config.mlp_bias,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_ids) if config.eos_token_ids else None,
        "torch_dtype": "float32",
    }


def save_checkpoint(model: Transformer, directory: Path, tokenizer: ByteTokenizer | None = None,
                    policy_defaults: dict | None = None) -> None:
    """``policy_defaults``: CachePolicy fields to serve this model with (``POLICY_FILE``)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()
             if not (model.config.tie_word_embeddings and k == "lm_head.weight")}
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hf_config_dict(model), indent=2) + "\n")
    if tokenizer is not None:
        (directory / "tokenizer_config.json").write_text(
            json.dumps(tokenizer.to_config(), indent=2) + "\n")
    if policy_defaults:
        (directory / POLICY_FILE).write_text(json.dumps(policy_defaults, indent=2) + "\n")
