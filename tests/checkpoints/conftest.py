"""The real default model's file, and a loader for transformers' own GGUF reading of a file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snapstream.checkpoints.registry import model_path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return model_path()


def hf_gguf_model(path: Path):
    """transformers' GGUF loader (its own dequantization and Q/K un-permutation)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def hf_gguf_tokenizer(path: Path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
