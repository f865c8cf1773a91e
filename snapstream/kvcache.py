"""KV cache containers in slot layout: one sequence, and the fixed pool the decoder batches over.

Keys are stored already rotated at their absolute positions, so slot order is irrelevant to
attention; ``positions`` holds each slot's absolute position, ``-1`` for an empty slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from snapstream.config import ModelConfig
from snapstream.policy import CacheLayout

EMPTY = -1


@dataclass(frozen=True)
class SequenceCache:
    """The KV cache of one sequence; its tensor shapes depend only on the model and the layout."""

    layout: CacheLayout
    k: torch.Tensor  # (L, Hkv, S, D), S = layout.budget
    v: torch.Tensor  # (L, Hkv, S, D)
    positions: torch.Tensor  # (L, Hkv, S) int32, EMPTY where unused
    prompt_len: int
    next_position: int  # absolute position of the next token to be written

    def __post_init__(self) -> None:
        num_layers, num_kv_heads, num_slots, _ = self.k.shape
        if num_slots != self.layout.budget or self.v.shape != self.k.shape:
            raise ValueError(f"cache tensors {tuple(self.k.shape)} do not match {self.layout}")
        if self.positions.shape != (num_layers, num_kv_heads, num_slots):
            raise ValueError(f"positions {tuple(self.positions.shape)} do not match the keys")
        if not 0 < self.prompt_len <= self.next_position:
            raise ValueError(f"need 0 < prompt_len <= next_position, got {self.prompt_len}, "
                             f"{self.next_position}")

    @property
    def num_tokens_held(self) -> int:
        return int((self.positions[0, 0] != EMPTY).sum())


class BatchCache:
    """A fixed pool of ``batch_size`` rows sharing one layout: every decode step sees one shape."""

    def __init__(
        self, config: ModelConfig, layout: CacheLayout, batch_size: int,
        dtype: torch.dtype, device: torch.device | str = "cpu",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.layout = layout
        shape = (config.num_layers, batch_size, config.num_kv_heads, layout.budget, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, Hkv, S, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, Hkv, S, D)
        self.positions = torch.full(shape[:-1], EMPTY, dtype=torch.int32, device=device)

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def insert(self, row: int, seq: SequenceCache) -> None:
        if seq.layout != self.layout:
            raise ValueError(f"sequence layout {seq.layout} does not match the pool's "
                             f"{self.layout}")
        self.k[:, row].copy_(seq.k)
        self.v[:, row].copy_(seq.v)
        self.positions[:, row].copy_(seq.positions)

    def clear(self, row: int) -> None:
        self.positions[:, row].fill_(EMPTY)
