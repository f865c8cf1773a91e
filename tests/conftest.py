"""Shared fixtures: small random checkpoints with the tiny byte-level BPE tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.tiny_models import TINY_VOCAB_SIZE, write_tiny_model, write_tokenizer_files


def write_hf_checkpoint(directory: Path, kind: str, **config_overrides) -> Path:
    """Save a random LlamaForCausalLM / Qwen2ForCausalLM with transformers itself."""
    import transformers

    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}
    config_cls, model_cls = classes[kind]
    fields = dict(vocab_size=TINY_VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=4096, bos_token_id=None, eos_token_id=263)
    fields.update(config_overrides)
    torch.manual_seed(1234)
    model = model_cls(config_cls(**fields))
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    write_tokenizer_files(directory)
    return directory


# the served name of tiny_model_dir (a directory's name): one name whatever other fixtures made
TINY_MODEL_NAME = "tiny-model"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama with the tiny tokenizer and chat template, for the services."""
    directory = tmp_path_factory.mktemp(TINY_MODEL_NAME, numbered=False)
    return write_tiny_model(directory, context=2048)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
    return write_hf_checkpoint(tmp_path_factory.mktemp("llama"), "llama", rope_scaling=rope)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory) -> Path:
    return write_hf_checkpoint(tmp_path_factory.mktemp("qwen2"), "qwen2",
                               tie_word_embeddings=True)


@pytest.fixture
def kernel_cap():
    """``kernel_cap(name)`` sends the CPU kernels down the path of that cap (one of
    ``snapstream.kernels.distinct_caps()``) for the rest of the test; the cap is restored after."""
    from snapstream import kernels

    before = kernels.kernel_cap()
    yield kernels.set_kernel_cap
    kernels.set_kernel_cap(before)
