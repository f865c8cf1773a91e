"""Load a Hugging Face checkpoint directory: config.json + (sharded) safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from snapstream.config import ModelConfig
from snapstream.model import Transformer

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    raise ValueError(f"{path}: no model.safetensors or model.safetensors.index.json")


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in checkpoint_files(path):
        state.update(load_file(file))
    return {k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> Transformer:
    """Build the model on the meta device and assign the checkpoint's tensors into it."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise ValueError(f"{path}: not a checkpoint directory (no config.json)")
    config = ModelConfig.from_file(path / "config.json")
    with torch.device("meta"):
        model = Transformer(config)
    state = load_state_dict(path)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {k for k in model.state_dict() if not (
        config.tie_word_embeddings and k == "lm_head.weight")}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        raise ValueError(
            f"{path}: checkpoint does not match config.json: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.rotary = type(model.rotary)(config)  # real (non-meta) inv_freq buffer
    return model.to(device=device, dtype=dtype).eval()
