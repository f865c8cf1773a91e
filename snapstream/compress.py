"""Turn a prompt's full KV cache into a :class:`SequenceCache` in the policy's slot layout."""

from __future__ import annotations

import torch

from snapstream.kvcache import EMPTY, GroupKV, ModelLayout, SequenceCache
from snapstream.kvquant import as_bits, kv_codec
from snapstream.policy import CacheLayout
from snapstream.snapkv import select_topk


def kept_positions(layout: CacheLayout, prompt_len: int, scores: torch.Tensor | None
                   ) -> torch.Tensor:
    """Absolute positions kept per layer and KV head, in slot order of sinks | selected | recent.

    scores (L, Hkv, P) are SnapKV scores, needed only when the layout selects (n_topk > 0).
    Returns (L, Hkv, n_kept) int64, or (n_kept,) shared by every head when nothing is selected.
    """
    sinks = torch.arange(layout.n_sink)
    recent = torch.arange(prompt_len - layout.n_recent, prompt_len)
    if layout.n_topk == 0:
        return torch.cat((sinks, recent))  # (n_kept,)
    picked = select_topk(scores, layout.n_sink, layout.n_recent, layout.n_topk)  # (L, Hkv, K)
    num_layers, num_kv_heads = picked.shape[:2]
    return torch.cat((
        sinks.expand(num_layers, num_kv_heads, -1), picked,
        recent.expand(num_layers, num_kv_heads, -1),
    ), dim=-1)


def slot_indices(layout: CacheLayout, positions: torch.Tensor) -> torch.Tensor:
    """Absolute positions (any shape) -> their slots under ``layout`` (same shape)."""
    ring = layout.ring_start + (positions - layout.ring_start) % layout.n_ring
    return torch.where(positions < layout.ring_start, positions, ring)


def build_sequence_cache(
    layout: ModelLayout, k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor | None,
    dtype: torch.dtype | None = None,
) -> SequenceCache:
    """k, v (L, Hkv, P, D) of the whole prompt, every layer, and their SnapKV scores (L, Hkv, P)
    (only read for a group whose layout selects) -> the compressed (or merely placed) cache."""
    parts = []
    for group in layout.groups:
        group_scores = None if scores is None else _rows(scores, group.layers)
        parts.append(GroupKV(group, *compress_kv(group.layout, _rows(k, group.layers),
                                                 _rows(v, group.layers), group_scores, dtype)))
    prompt_len = k.shape[2]
    return SequenceCache(tuple(parts), prompt_len=prompt_len, next_position=prompt_len)


def _rows(tensor: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
    """tensor (L, ...) -> (len(layers), ...): a view when the layers are consecutive (every
    layer of a Llama model), else a copy of those rows."""
    start = layers[0]
    if layers == tuple(range(start, start + len(layers))):
        return tensor[start : start + len(layers)]
    return tensor[torch.tensor(layers, device=tensor.device)]


def compress_kv(
    layout: CacheLayout, k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor | None,
    dtype: torch.dtype | None = None, rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k, v (L, Hkv, P, D) of the whole prompt, for any number of layers L, and their SnapKV
    scores (L, Hkv, P) -> K, V (L, Hkv, S, W) in the KV dtype ``dtype`` (default: k's; only the
    kept tokens are converted, an int8 row quantized here once; W: its row width,
    :mod:`snapstream.kvquant`) and positions (L, Hkv, S) int32, EMPTY where no token is.
    rows (L, Hkv, P) int64, optional: k, v (L, Hkv, N, D) hold a subset of the prompt's
    positions, each kept position's at its ``rows`` index (a stored document's keys and the
    question's; the positions kept must be among them)."""
    num_layers, num_kv_heads, _, head_dim = k.shape
    prompt_len = k.shape[2] if rows is None else rows.shape[2]
    codec = kv_codec(dtype or k.dtype)
    shape = (num_layers, num_kv_heads, layout.budget)
    width = codec.row_width(head_dim)
    out_k = k.new_zeros(*shape, width, dtype=codec.dtype)  # (L, Hkv, S, W)
    out_v = v.new_zeros(*shape, width, dtype=codec.dtype)
    out_pos = torch.full(shape, EMPTY, dtype=torch.int32, device=k.device)  # (L, Hkv, S)
    if rows is None and not layout.compresses(prompt_len):
        # a prompt that fits: position p in slot p (p < n_kept <= budget), k and v whole
        as_bits(out_k)[:, :, :prompt_len] = as_bits(codec.encode(k))
        as_bits(out_v)[:, :, :prompt_len] = as_bits(codec.encode(v))
        out_pos[:, :, :prompt_len] = torch.arange(prompt_len, dtype=torch.int32, device=k.device)
        return out_k, out_v, out_pos
    if layout.compresses(prompt_len):
        keep = kept_positions(layout, prompt_len, scores).to(k.device)  # (L, Hkv, n_kept)
        keep = keep.expand(num_layers, num_kv_heads, -1)
        slots = torch.cat((
            torch.arange(layout.ring_start, device=k.device).expand(num_layers, num_kv_heads, -1),
            slot_indices(layout, keep[..., layout.ring_start:]),
        ), dim=-1)  # (L, Hkv, n_kept)
    else:  # rows given, a prompt that fits: position p in slot p
        keep = torch.arange(prompt_len, device=k.device).expand(num_layers, num_kv_heads, -1)
        slots = keep
    taken = keep if rows is None else rows.gather(2, keep)  # (L, Hkv, n_kept): rows of k
    # whole rows by advanced indexing (3-4x faster than gather / scatter_ with their indices
    # expanded over D and W, which read an index per element)
    layer = torch.arange(num_layers, device=k.device)[:, None, None]  # (L, 1, 1)
    head = torch.arange(num_kv_heads, device=k.device)[None, :, None]  # (1, Hkv, 1)
    as_bits(out_k)[layer, head, slots] = as_bits(codec.encode(k[layer, head, taken]))
    as_bits(out_v)[layer, head, slots] = as_bits(codec.encode(v[layer, head, taken]))
    out_pos.scatter_(2, slots, keep.to(torch.int32))
    return out_k, out_v, out_pos
