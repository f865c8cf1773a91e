"""A GGUF file's tensors as Hugging Face-named weights, one tensor at a time: float tensors
(dequantized) for a state dict, and, for the linear layers of the file's own format, its
quantized blocks as exact int4/int8 codes (:mod:`snapstream.checkpoints.gguf_blocks`). Each
tensor's pages of the mapped file are given back once it is read, so loading never holds the
file and the model at once.

llama.cpp's converter permutes the rows of Llama's Q and K projections (it pairs rotary
dimensions as neighbours, while Hugging Face's checkpoints pair dimension i with i + D/2);
:func:`unpermute_rows` undoes that, so the weights run on our half-split RoPE unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from snapstream.checkpoints.gguf_blocks import BLOCK_TYPES, decode_rows
from snapstream.checkpoints.gguf_file import GGUFFile
from snapstream.checkpoints.gguf_model import ROPE_FREQS, architecture_of, hf_name
from snapstream.config import ModelConfig
from snapstream.quant import PACK_ROWS, GroupedCodes


def unpermute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute``: rows (H, D/2, 2) back to (H, 2, D/2)."""
    rest = weight.shape[1:]
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, half, 2, *rest).transpose(1, 2).reshape(weight.shape)


def is_block_linear(target: str) -> bool:
    """Whether the Hugging Face weight ``target`` is served from its blocks: the projections,
    the LM head and the embedding (the head's rows where they are tied, a table of its own
    where not: no float copy of a 150k-token vocabulary)."""
    return target.endswith("_proj.weight") or target in ("lm_head.weight",
                                                         "model.embed_tokens.weight")


def _row_order(file: GGUFFile, config: ModelConfig, name: str, rows: int) -> torch.Tensor | None:
    """The order to read a tensor's rows in (Q and K of a permuted architecture), else None."""
    heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}
    kind = name.split(".")[-2]  # blk.N.attn_q.weight -> attn_q
    if not (architecture_of(file).permuted_qk and kind in heads):
        return None
    return unpermute_rows(torch.arange(rows)[:, None], heads[kind])[:, 0]


def _targets(file: GGUFFile) -> Iterator[tuple[str, str]]:
    arch = architecture_of(file)
    for name in file.tensors:
        target = hf_name(name, arch)
        if target is None:
            if name != ROPE_FREQS:
                raise ValueError(f"{file.path}: unexpected tensor {name!r} for {arch.model_type}")
            continue
        yield name, target


def block_names(file: GGUFFile) -> dict[str, str]:
    """GGUF name -> Hugging Face name of the tensors served from their blocks."""
    return {name: target for name, target in _targets(file)
            if file.tensors[name].tensor_type in BLOCK_TYPES and is_block_linear(target)}


@dataclass(frozen=True)
class BlockTensor:
    """A quantized tensor of the file, read on demand: ``chunks()`` its codes a few thousand
    rows at a time (the tensor's pages of the map given back after the last), ``whole()`` all
    of them at once."""

    bits: int
    rows: int
    chunks: Callable[[], Iterator[GroupedCodes]]

    def whole(self) -> GroupedCodes:
        return GroupedCodes.stacked(list(self.chunks()))


def _chunks(file: GGUFFile, name: str) -> Iterator[GroupedCodes]:
    info = file.tensors[name]
    bits = BLOCK_TYPES[info.tensor_type].bits
    for start in range(0, len(info.data), PACK_ROWS):  # decoded as they are packed
        rows = slice(start, start + PACK_ROWS)
        got = decode_rows(info.tensor_type, info.data[rows])
        file.release(name, rows)
        yield GroupedCodes(torch.from_numpy(got.codes), torch.from_numpy(got.scales),
                           None if got.offsets is None else torch.from_numpy(got.offsets), bits,
                           None if got.factors is None else torch.from_numpy(got.factors))


def block_tensor(file: GGUFFile, config: ModelConfig, name: str) -> BlockTensor:
    """Tensor ``name``'s blocks as codes (N, K), rows in the model's order."""
    info = file.tensors[name]
    bits, rows = BLOCK_TYPES[info.tensor_type].bits, len(info.data)
    order = _row_order(file, config, name, rows)
    if order is None:
        return BlockTensor(bits, rows, lambda: _chunks(file, name))
    return BlockTensor(bits, rows, lambda: iter(
        [GroupedCodes.stacked(list(_chunks(file, name))).rows(order)]))


def block_weights(file: GGUFFile, config: ModelConfig) -> Iterator[tuple[str, BlockTensor]]:
    """(Hugging Face name, tensor) of every linear weight served from its blocks."""
    for name, target in block_names(file).items():
        yield target, block_tensor(file, config, name)


def state_dict_from_gguf(file: GGUFFile, config: ModelConfig, dtype: torch.dtype,
                         skip_blocks: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor dequantized, or with ``skip_blocks`` those ``block_weights`` does not give."""
    skipped = block_names(file) if skip_blocks else {}
    state: dict[str, torch.Tensor] = {}
    for name, target in _targets(file):
        if name in skipped:
            continue
        tensor = torch.from_numpy(file.array(name))
        file.release(name)
        order = _row_order(file, config, name, len(tensor))
        state[target] = (tensor if order is None else tensor[order]).to(dtype)
    return state
