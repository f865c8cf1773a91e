"""A GGUF file as a checkpoint: config, weights, tokenizer and chat template from one file."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from snapstream.checkpoints.gguf_blocks import BLOCK_TYPES
from snapstream.checkpoints.gguf_file import GGUFFile
from snapstream.checkpoints.gguf_model import config_from_gguf
from snapstream.checkpoints.gguf_tokenizer import tokenizer_from_gguf
from snapstream.checkpoints.model_sources import file_sha256
from snapstream.checkpoints.registry import int4_x_bits_of
from snapstream.config import ModelConfig
from snapstream.tokenizer import Tokenizer

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

    from snapstream.checkpoints.gguf_weights import BlockTensor

LINEAR_SUFFIXES = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                   "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
# Policies shipped for known GGUF files, one file per model: <sha256 of the GGUF>.json.
SHIPPED_POLICIES = Path(__file__).parent.parent / "policies"


class GGUFCheckpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = GGUFFile(path)
        self.name = path.stem

    @cached_property
    def native_format(self) -> str:
        """gguf (the file's blocks as exact int4/int8 codes) when every linear weight of the
        layers is in one of ``BLOCK_TYPES``, else float32."""
        kinds = {tensor.tensor_type for name, tensor in self.file.tensors.items()
                 if name.startswith("blk.") and name.endswith(LINEAR_SUFFIXES)}
        return "gguf" if kinds and kinds <= BLOCK_TYPES.keys() else "float32"

    @cached_property
    def config(self) -> ModelConfig:
        return config_from_gguf(self.file)

    def state_dict(self, dtype: torch.dtype, skip_blocks: bool = False
                   ) -> dict[str, torch.Tensor]:
        """Every weight dequantized to ``dtype``; with ``skip_blocks`` all but those
        :meth:`block_weights` gives."""
        from snapstream.checkpoints.gguf_weights import state_dict_from_gguf

        return state_dict_from_gguf(self.file, self.config, dtype, skip_blocks)

    def block_weights(self) -> Iterator[tuple[str, BlockTensor]]:
        """(Hugging Face name, its codes on demand) of each linear weight held in quantized
        blocks, one at a time."""
        from snapstream.checkpoints.gguf_weights import block_weights

        return block_weights(self.file, self.config)

    def tokenizer(self) -> Tokenizer:
        return tokenizer_from_gguf(self.file)

    @cached_property
    def sha256(self) -> str:
        return file_sha256(self.path)

    @property
    def policy_file(self) -> Path:
        return SHIPPED_POLICIES / f"{self.sha256}.json"

    @property
    def int4_x_bits(self) -> int | None:
        """The registry's choice for this file (None: the kernels' own)."""
        return int4_x_bits_of(self.sha256)
