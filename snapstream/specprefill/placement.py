"""A target cache prefilled from kept tokens at their original positions, laid out so that
decode continues as if the whole prompt had been there.

The prefill lays the K kept tokens out by their index (0..K-1), as any K-token prompt; their
keys are rotated at their original positions. Here each slot takes its token's original
position, and the ring turns by P - K, so the next token (at original position P) overwrites
the oldest ring entry, as the layout's invariant asks.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from snapstream.kvcache import EMPTY, SequenceCache


def at_original_positions(cache: SequenceCache, positions: torch.Tensor) -> SequenceCache:
    """cache of K kept tokens laid out by index; positions (K,) int64, ascending, the last the
    prompt's last token -> the same tokens at ``positions`` (next position: the last + 1)."""
    kept, layout = cache.prompt_len, cache.layout
    prompt_len = int(positions[-1]) + 1
    held = cache.positions.long()  # (L, Hkv, S)
    moved = torch.where(held == EMPTY, EMPTY, positions[held.clamp(min=0)]).to(torch.int32)
    shift = (prompt_len - kept) % layout.n_ring
    ring = slice(layout.ring_start, layout.budget)
    k, v = cache.k.clone(), cache.v.clone()  # (L, Hkv, S, D)
    for tensor in (k, v, moved):
        tensor[:, :, ring] = tensor[:, :, ring].roll(shift, dims=2)
    return replace(cache, k=k, v=v, positions=moved, prompt_len=prompt_len,
                   next_position=prompt_len)
