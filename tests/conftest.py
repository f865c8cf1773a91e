"""Shared fixtures: small random-initialised checkpoints in Hugging Face layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from snapstream.config import ModelConfig
from snapstream.model import Transformer
from snapstream.tokenizer import ByteTokenizer


def tiny_config(**overrides) -> ModelConfig:
    fields = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=131072)
    fields.update(overrides)
    return ModelConfig(**fields)


def random_model(config: ModelConfig, seed: int = 0, dtype=torch.float32) -> Transformer:
    """Random weights with enough spread that attention is far from uniform."""
    torch.manual_seed(seed)
    model = Transformer(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, 0.08 if "embed" not in name else 1.0)
    return model.to(dtype).eval()


def write_hf_checkpoint(directory: Path, kind: str, **config_overrides) -> Path:
    """Save a random LlamaForCausalLM / Qwen2ForCausalLM with transformers itself."""
    import transformers

    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}
    config_cls, model_cls = classes[kind]
    fields = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  bos_token_id=256, eos_token_id=257)
    fields.update(config_overrides)
    torch.manual_seed(1234)
    model = model_cls(config_cls(**fields))
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    (directory / "tokenizer_config.json").write_text(json.dumps(ByteTokenizer().to_config()))
    return directory


@pytest.fixture(scope="session")
def byte_model_dir(tmp_path_factory) -> Path:
    """A tiny random model with the embedded model's byte tokenizer, for the services."""
    from snapstream.checkpoint import save_checkpoint
    from snapstream.train.config import TOKENIZER

    path = tmp_path_factory.mktemp("byte-model")
    save_checkpoint(random_model(tiny_config(vocab_size=264, max_position_embeddings=2048)),
                    path, TOKENIZER)
    return path


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
    return write_hf_checkpoint(tmp_path_factory.mktemp("llama"), "llama", rope_scaling=rope)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory) -> Path:
    return write_hf_checkpoint(tmp_path_factory.mktemp("qwen2"), "qwen2",
                               tie_word_embeddings=True)
