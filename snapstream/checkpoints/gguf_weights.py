"""A GGUF file's tensors as a Hugging Face-named state dict.

llama.cpp's converter permutes the rows of Llama's Q and K projections (it pairs rotary
dimensions as neighbours, while Hugging Face's checkpoints pair dimension i with i + D/2);
:func:`unpermute_rows` undoes that, so the weights run on our half-split RoPE unchanged.
"""

from __future__ import annotations

import torch

from snapstream.checkpoints.gguf_file import GGUFFile
from snapstream.checkpoints.gguf_model import ROPE_FREQS, architecture_of, hf_name
from snapstream.config import ModelConfig


def unpermute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute``: rows (H, D/2, 2) back to (H, 2, D/2)."""
    rest = weight.shape[1:]
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, half, 2, *rest).transpose(1, 2).reshape(weight.shape)


def state_dict_from_gguf(file: GGUFFile, config: ModelConfig, dtype: torch.dtype
                         ) -> dict[str, torch.Tensor]:
    arch = architecture_of(file)
    heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}
    state: dict[str, torch.Tensor] = {}
    for name in file.tensors:
        target = hf_name(name, arch)
        if target is None:
            if name != ROPE_FREQS:
                raise ValueError(f"{file.path}: unexpected tensor {name!r} for {arch.model_type}")
            continue
        tensor = torch.from_numpy(file.array(name))
        kind = name.split(".")[-2]  # blk.N.attn_q.weight -> attn_q
        if arch.permuted_qk and kind in heads:
            tensor = unpermute_rows(tensor, heads[kind])
        state[target] = tensor.to(dtype)
    return state
