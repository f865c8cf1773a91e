"""Checkpoints: a Hugging Face directory or a GGUF file, read into one model, tokenizer and
default cache policy. ``None`` names the default model (SmolLM2-135M-Instruct). Torch-free
until weights are read: the router takes config and tokenizer from here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from snapstream.checkpoints.gguf import GGUFCheckpoint
from snapstream.checkpoints.gguf_file import is_gguf
from snapstream.checkpoints.hf import HFCheckpoint
from snapstream.checkpoints.registry import MODELS, model_path
from snapstream.config import ModelConfig
from snapstream.tokenizer import Tokenizer

if TYPE_CHECKING:
    import torch


class Checkpoint(Protocol):
    path: Path
    name: str
    config: ModelConfig
    policy_file: Path  # the model's default cache policy, when the file exists
    native_format: str  # the weight format its weights already have (weight_formats)
    int4_x_bits: int | None  # its int4 layers' x codes (quant.Int4Linear.x_bits); None: 15

    def state_dict(self, dtype: torch.dtype) -> dict[str, torch.Tensor]: ...

    def tokenizer(self) -> Tokenizer: ...


def open_checkpoint(path: str | Path | None = None) -> Checkpoint:
    path = model_path(path)
    if path.is_dir():
        return HFCheckpoint(path)
    if is_gguf(path):
        return GGUFCheckpoint(path)
    what = "does not exist" if not path.exists() else "is neither a directory nor a GGUF file"
    raise ValueError(f"model {path} {what}: give a model name ({', '.join(MODELS)}), a .gguf "
                     "file or a Hugging Face checkpoint directory")
