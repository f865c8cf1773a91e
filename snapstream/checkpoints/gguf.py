"""A GGUF file as a checkpoint: config, weights, tokenizer and chat template from one file."""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from snapstream.checkpoints.gguf_file import GGUFFile
from snapstream.checkpoints.gguf_model import config_from_gguf
from snapstream.checkpoints.gguf_tokenizer import tokenizer_from_gguf
from snapstream.config import ModelConfig
from snapstream.tokenizer import Tokenizer

if TYPE_CHECKING:
    import torch

LINEAR_SUFFIXES = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                   "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
NATIVE_FORMATS = {"int4": {"Q4_0", "Q4_1"}, "int8": {"Q8_0"}}
# Policies shipped for known GGUF files, one file per model: <sha256 of the GGUF>.json.
SHIPPED_POLICIES = Path(__file__).parent.parent / "policies"


class GGUFCheckpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = GGUFFile(path)
        self.name = path.stem

    @cached_property
    def native_format(self) -> str:
        """int4 when every linear weight of the layers is Q4_0/Q4_1 (4-bit groups of 32, what
        the int4 format keeps), int8 when every one is Q8_0, else float32."""
        kinds = {tensor.tensor_type.name for name, tensor in self.file.tensors.items()
                 if name.startswith("blk.") and name.endswith(LINEAR_SUFFIXES)}
        for fmt, types in NATIVE_FORMATS.items():
            if kinds and kinds <= types:
                return fmt
        return "float32"

    @cached_property
    def config(self) -> ModelConfig:
        return config_from_gguf(self.file)

    def state_dict(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        from snapstream.checkpoints.gguf_weights import state_dict_from_gguf

        return state_dict_from_gguf(self.file, self.config, dtype)

    def tokenizer(self) -> Tokenizer:
        return tokenizer_from_gguf(self.file)

    @cached_property
    def policy_file(self) -> Path:
        with self.path.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        return SHIPPED_POLICIES / f"{digest}.json"
