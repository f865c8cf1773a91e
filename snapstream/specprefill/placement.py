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

from snapstream.kvcache import EMPTY, GroupKV, SequenceCache


def at_original_positions(cache: SequenceCache, positions: torch.Tensor) -> SequenceCache:
    """cache of K kept tokens laid out by index; positions (K,) int64, ascending, the last the
    prompt's last token -> the same tokens at ``positions`` (next position: the last + 1).
    Every layer group is moved alike (a sliding layer's ring holds the last kept tokens)."""
    prompt_len = int(positions[-1]) + 1
    groups = tuple(_moved(part, positions, prompt_len - cache.prompt_len)
                   for part in cache.groups)
    return replace(cache, groups=groups, prompt_len=prompt_len, next_position=prompt_len)


def _moved(part: GroupKV, positions: torch.Tensor, turn: int) -> GroupKV:
    """One group's slots at the kept tokens' original positions, its ring turned by ``turn``."""
    layout = part.group.layout
    held = part.positions.long()  # (Lg, Hkv, S)
    moved = torch.where(held == EMPTY, EMPTY, positions[held.clamp(min=0)]).to(torch.int32)
    ring = slice(layout.ring_start, layout.budget)
    k, v = part.k.clone(), part.v.clone()  # (Lg, Hkv, S, D)
    for tensor in (k, v, moved):
        tensor[:, :, ring] = tensor[:, :, ring].roll(turn % layout.n_ring, dims=2)
    return replace(part, k=k, v=v, positions=moved)
