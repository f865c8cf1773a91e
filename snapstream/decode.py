"""The static decode step: one token for every row of a :class:`BatchCache`, one tensor shape.

Row state lives in tensors (positions, slot contents), never in Python values the graph would
specialise on, so sequences with contexts of 10 or 100k tokens run the same compiled graph.
"""

from __future__ import annotations

import torch

from snapstream.attention import slot_attention
from snapstream.compress import slot_indices
from snapstream.kvcache import BatchCache
from snapstream.model import Transformer
from snapstream.policy import CacheLayout


def decode_step(
    model: Transformer, k_cache: torch.Tensor, v_cache: torch.Tensor, pos_cache: torch.Tensor,
    token_ids: torch.Tensor, positions: torch.Tensor, layout: CacheLayout,
) -> torch.Tensor:
    """token_ids, positions (B,) -> logits (B, V); writes each row's new K/V into its ring slot.

    k_cache, v_cache (L, B, Hkv, S, D) and pos_cache (L, B, Hkv, S) are updated in place.
    """
    rows = torch.arange(token_ids.shape[0], device=token_ids.device)  # (B,)
    slots = slot_indices(layout, positions)  # (B,)
    pos_cache[:, rows, :, slots] = positions.to(torch.int32)[:, None, None]  # (B, L, Hkv)
    empty = pos_cache[0, :, 0] < 0  # (B, S), the same for every layer and KV head
    windows = model.config.attention_windows
    masks = {None: empty}
    for layer_idx, window in enumerate(windows):  # sliding layers hold the same positions
        if window not in masks:  # slots older than the window are masked too
            held = pos_cache[layer_idx, :, 0]  # (B, S)
            masks[window] = empty | (held <= positions[:, None] - window)

    def attend(layer_idx: int, q, k, v) -> torch.Tensor:
        return slot_attention(q, k_cache[layer_idx], v_cache[layer_idx], k, v, slots,
                              masks[windows[layer_idx]])

    hidden = model(token_ids[:, None], positions[:, None], attend)  # (B, 1, hidden)
    return model.logits(hidden[:, 0])  # (B, V)


class Decoder:
    """Owns a slot pool and its (optionally compiled) decode step."""

    def __init__(self, model: Transformer, cache: BatchCache, compile: bool = False) -> None:
        self.model, self.cache = model, cache
        self._step = (
            torch.compile(decode_step, fullgraph=True, dynamic=False) if compile else decode_step
        )

    @torch.no_grad()
    def step(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """token_ids, positions (B,) int64 on the cache's device -> float32 logits (B, V)."""
        cache = self.cache
        return self._step(
            self.model, cache.k, cache.v, cache.positions, token_ids, positions, cache.layout
        )
