"""A cache prefilled from the kept tokens of a longer prompt (speculative prefill's selection)
at their original positions, laid out so that decode continues as if the whole prompt had been
there.

The prefill lays the K kept tokens out by their index (0..K-1), as any K-token prompt; their
keys are rotated at their original positions. Here each slot takes its token's original
position. A global group's ring turns by P - K, so the next token (at original position P)
overwrites the oldest ring entry, as the layout's invariant asks. A sliding group keeps the
kept tokens within its window of original positions, each in slot position % window (its
ring's invariant): decode then sees what a query at that position would.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from snapstream.compress import slot_indices
from snapstream.kvcache import EMPTY, GroupKV, SequenceCache


def at_original_positions(cache: SequenceCache, positions: torch.Tensor) -> SequenceCache:
    """cache of K kept tokens laid out by index; positions (K,) int64, ascending, the last the
    prompt's last token -> the same tokens at ``positions`` (next position: the last + 1)."""
    prompt_len = int(positions[-1]) + 1
    groups = tuple(_in_window(part, positions, prompt_len) if part.group.window
                   else _turned(part, positions, prompt_len - cache.prompt_len)
                   for part in cache.groups)
    return replace(cache, groups=groups, prompt_len=prompt_len, next_position=prompt_len)


def _original(part: GroupKV, positions: torch.Tensor) -> torch.Tensor:
    """(Lg, Hkv, S) int64: each slot's original position, EMPTY where it holds no token."""
    held = part.positions.long()  # (Lg, Hkv, S) kept-token indices
    return torch.where(held == EMPTY, EMPTY, positions[held.clamp(min=0)])


def _turned(part: GroupKV, positions: torch.Tensor, turn: int) -> GroupKV:
    """A global group's slots at the kept tokens' original positions, its ring turned by
    ``turn``."""
    layout = part.group.layout
    moved = _original(part, positions).to(torch.int32)  # (Lg, Hkv, S)
    ring = slice(layout.ring_start, layout.budget)
    k, v = part.k.clone(), part.v.clone()  # (Lg, Hkv, S, W)
    for tensor in (k, v, moved):
        tensor[:, :, ring] = tensor[:, :, ring].roll(turn % layout.n_ring, dims=2)
    return replace(part, k=k, v=v, positions=moved)


def _in_window(part: GroupKV, positions: torch.Tensor, prompt_len: int) -> GroupKV:
    """A sliding group's slots: the kept tokens at original positions in (P - 1 - window,
    P - 1], each in slot position % window; the others empty. (The group held the last
    ``window`` kept tokens by index, a superset of those, alike in every layer and head.)"""
    original = _original(part, positions)[0, 0]  # (S,)
    src = ((original != EMPTY) & (original > prompt_len - 1 - part.group.window)).nonzero()[:, 0]
    dst = slot_indices(part.group.layout, original[src])  # (n,)
    k, v = torch.zeros_like(part.k), torch.zeros_like(part.v)  # (Lg, Hkv, S, W)
    moved = torch.full_like(part.positions, EMPTY)  # (Lg, Hkv, S)
    k[:, :, dst], v[:, :, dst] = part.k[:, :, src], part.v[:, :, src]
    moved[:, :, dst] = original[src].to(moved.dtype)
    return replace(part, k=k, v=v, positions=moved)
