"""The static decode step: one token for each of the first rows of a :class:`BatchCache`.

Row state lives in tensors (positions, slot contents), never in Python values the graph would
specialise on, so sequences with contexts of 10 or 100k tokens run the same compiled graph. A
step runs a power-of-two prefix of the pool's rows that covers the rows in use
(:meth:`Decoder.step_rows`): one graph per row count, as CUDA graphs are captured per batch
size, so one sequence in a pool of 16 rows costs a one-row step.
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
    """token_ids, positions (b,) -> logits (b, V) for the pool's first b rows; writes each
    row's new K/V into its slot of every layer group (a sliding group's ring then holds exactly
    the window the query sees).

    caches: per group of ``layout``, the pool's k and v (Lg, B, Hkv, S, W) and which slots hold
    a token (B, S) bool, B >= b, updated in place. fused: the model's layers as
    ``decode_layer`` takes them (:func:`snapstream.fused_decode.fused_layers`), run where the
    batch allows; the same result as the modules'.
    """
    b = token_ids.shape[0]
    caches = tuple((k[:, :b], v[:, :b], filled[:b]) for k, v, filled in caches)  # the first b rows
    rows = torch.arange(b, device=token_ids.device)  # (b,)
    where, slots, empty = {}, [], []
    for index, (group, (_, _, filled)) in enumerate(zip(layout.groups, caches, strict=True)):
        group_slots = slot_indices(group.layout, positions)  # (B,)
        filled[rows, group_slots] = True
        slots.append(group_slots)
        empty.append(~filled)  # (b, S), the same for every layer and KV head
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

        hidden = fused_forward(model, fused, token_ids, positions, cache_of)  # (b, hidden)
    else:
        hidden = model(token_ids[:, None], positions[:, None], attend)[:, 0]  # (b, hidden)
    return model.logits(hidden)  # (b, V)


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

    def step_rows(self, rows_in_use: int) -> int:
        """The rows a step runs so that it covers the pool's first ``rows_in_use``: the next
        power of two, at most the pool, where the fused kernels run at the pool's size (each
        row's result is then the same at any row count, so a resumed sequence decodes the same
        tokens whatever its neighbours); the whole pool elsewhere (a GEMM's or a GPU's sums may
        depend on the row count)."""
        batch = self.cache.batch_size
        if not 1 <= rows_in_use <= batch:
            raise ValueError(f"rows_in_use must be in [1, {batch}], got {rows_in_use}")
        if not runs_fused(self._fused, batch):
            return batch
        return min(batch, 1 << (rows_in_use - 1).bit_length())

    @torch.no_grad()
    def step(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """token_ids, positions (b,) int64 on the cache's device, b <= the pool's rows -> float32
        logits (b, V) of the pool's first b rows."""
        return self._step(self.model, self._caches, token_ids, positions, self.cache.layout,
                          self._fused)
