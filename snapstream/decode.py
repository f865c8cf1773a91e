"""The static decode step: one token for every row of a :class:`BatchCache`, one tensor shape.

Row state lives in tensors (positions, slot contents), never in Python values the graph would
specialise on, so sequences with contexts of 10 or 100k tokens run the same compiled graph.
"""

from __future__ import annotations

import torch

from snapstream.attention import slot_attention
from snapstream.compress import slot_indices
from snapstream.fused_decode import FusedLayer, fused_forward, fused_layers, runs_fused
from snapstream.kvcache import BatchCache, ModelLayout
from snapstream.model import Transformer


def decode_step(
    model: Transformer, caches: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...],
    token_ids: torch.Tensor, positions: torch.Tensor, layout: ModelLayout,
    fused: tuple[FusedLayer, ...] | None = None,
) -> torch.Tensor:
    """token_ids, positions (B,) -> logits (B, V); writes each row's new K/V into its slot of
    every layer group (a sliding group's ring then holds exactly the window the query sees).

    caches: per group of ``layout``, k and v (Lg, B, Hkv, S, W) and which slots hold a token
    (B, S) bool, updated in place. fused: the model's layers as ``decode_layer`` takes them
    (:func:`snapstream.fused_decode.fused_layers`), run where the batch allows; the same
    result as the modules'.
    """
    rows = torch.arange(token_ids.shape[0], device=token_ids.device)  # (B,)
    where, slots, empty = {}, [], []
    for index, (group, (_, _, filled)) in enumerate(zip(layout.groups, caches, strict=True)):
        group_slots = slot_indices(group.layout, positions)  # (B,)
        filled[rows, group_slots] = True
        slots.append(group_slots)
        empty.append(~filled)  # (B, S), the same for every layer and KV head
        where.update({layer: (index, local) for local, layer in enumerate(group.layers)})

    def attend(layer_idx: int, q, k, v) -> torch.Tensor:
        index, local = where[layer_idx]
        k_cache, v_cache, _ = caches[index]
        return slot_attention(q, k_cache[local], v_cache[local], k, v, slots[index], empty[index])

    if runs_fused(fused, len(token_ids)):
        def cache_of(layer_idx: int) -> tuple[torch.Tensor, ...]:
            index, local = where[layer_idx]
            k_cache, v_cache, _ = caches[index]
            return k_cache[local], v_cache[local], slots[index], empty[index]

        hidden = fused_forward(model, fused, token_ids, positions, cache_of)  # (B, hidden)
    else:
        hidden = model(token_ids[:, None], positions[:, None], attend)[:, 0]  # (B, hidden)
    return model.logits(hidden)  # (B, V)


class Decoder:
    """Owns a slot pool and its (optionally compiled) decode step; ``fuse``: run the layers as
    one op each where the model allows it (:mod:`snapstream.fused_decode`; False: the modules,
    for comparisons)."""

    def __init__(self, model: Transformer, cache: BatchCache, compile: bool = False,
                 fuse: bool = True) -> None:
        self.model, self.cache = model, cache
        self._fused = fused_layers(model) if fuse else None
        self._step = (
            torch.compile(decode_step, fullgraph=True, dynamic=False) if compile else decode_step
        )
        self._caches = tuple((group.k, group.v, group.filled) for group in cache.groups)

    @torch.no_grad()
    def step(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """token_ids, positions (B,) int64 on the cache's device -> float32 logits (B, V)."""
        return self._step(self.model, self._caches, token_ids, positions, self.cache.layout,
                          self._fused)
