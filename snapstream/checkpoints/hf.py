"""A Hugging Face checkpoint directory: config.json, (sharded) safetensors, tokenizer.json,
tokenizer_config.json (special tokens, chat template) or chat_template.jinja."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import tokenizers

from snapstream.chat import ChatTemplate
from snapstream.config import ModelConfig
from snapstream.policy import POLICY_FILE
from snapstream.tokenizer import Tokenizer, end_of_turn_ids

if TYPE_CHECKING:
    import torch

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _shift_norms(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Gemma's RMSNorms scale by ``1 + w``; snapstream's model holds ``1 + w`` (as GGUF does)."""
    return {k: v.float() + 1 if k.endswith("norm.weight") else v for k, v in state.items()}


# model_type -> how its Hugging Face weights become the model's
STATE_FIXES = {"gemma3": _shift_norms}


def _read_json(file: Path) -> dict:
    return json.loads(file.read_text()) if file.exists() else {}


def _ids(value) -> list[int]:
    return list(value) if isinstance(value, list) else ([] if value is None else [value])


class HFCheckpoint:
    def __init__(self, path: Path) -> None:
        if not (path / "config.json").exists():
            raise ValueError(f"{path}: not a checkpoint directory (no config.json)")
        self.path = path
        self.name = path.name
        self.config = ModelConfig.from_file(path / "config.json")
        self.policy_file = path / POLICY_FILE
        self.native_format = "float32"  # float weights, whatever their width
        self.int4_x_bits = None  # requantized int4 layers take the kernels' own

    def state_dict(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for file in self._weight_files():
            state.update(load_file(file))
        state = {k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}
        state = STATE_FIXES.get(self.config.model_type, dict)(state)
        return {k: v.to(dtype) for k, v in state.items()}

    def _weight_files(self) -> list[Path]:
        index = self.path / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            return [self.path / name for name in sorted(set(weight_map.values()))]
        single = self.path / "model.safetensors"
        if single.exists():
            return [single]
        raise ValueError(f"{self.path}: no model.safetensors or model.safetensors.index.json")

    def tokenizer(self) -> Tokenizer:
        file = self.path / "tokenizer.json"
        if not file.exists():
            raise ValueError(f"{self.path}: no tokenizer.json")
        inner = tokenizers.Tokenizer.from_file(str(file))
        model_config = _read_json(self.path / "config.json")
        generation = _read_json(self.path / "generation_config.json")
        declared = _ids(generation.get("eos_token_id", model_config.get("eos_token_id")))
        return Tokenizer(inner=inner, bos_token_id=model_config.get("bos_token_id"),
                         eos_token_ids=end_of_turn_ids(inner, declared),
                         chat_template=self._chat_template())

    def _chat_template(self) -> ChatTemplate | None:
        config = _read_json(self.path / "tokenizer_config.json")
        jinja = self.path / "chat_template.jinja"
        source = jinja.read_text() if jinja.exists() else config.get("chat_template")
        if isinstance(source, list):  # named templates: the default one
            source = next((t["template"] for t in source if t.get("name") == "default"), None)
        if not source:
            return None
        specials = tuple((name, _token_text(config[name])) for name in ("bos_token", "eos_token")
                         if config.get(name))
        return ChatTemplate(source, specials)


def _token_text(value) -> str:
    return value["content"] if isinstance(value, dict) else value
