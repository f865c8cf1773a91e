"""Straightforward reference implementations the engine is checked against.

Written for clarity, not speed: explicit loops over heads and positions, float64 where it helps.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from snapstream.kvcache import SequenceCache
from snapstream.kvquant import kv_float, to_kv
from snapstream.model import Transformer
from snapstream.policy import CacheLayout

# how far decode's logits may sit from masked_logits' per KV dtype: float32 rounding, except
# that a bfloat16 element or an int8 code may round the other way where the decode step's key
# or value differs from the full forward's in its last bit (the two sum in different orders, and
# the reference's matmuls differ by CPU): one rounding step of one row moves these tiny models'
# logits by ~1e-4; a slot lost or a scale misapplied moves them by ~0.1
LOGITS_ATOL = {torch.float32: 1e-4, torch.bfloat16: 1e-3, torch.int8: 1e-3,
               torch.float8_e4m3fn: 1e-3}


def snapkv_reference_scores(
    q_observed: torch.Tensor, k: torch.Tensor, kernel: int, pooling: str,
    present: torch.Tensor | None = None,
) -> torch.Tensor:
    """SnapKV (Li et al. 2024, Alg. 1) per query head, as kvpress's SnapKVPress computes it: the
    attention of each observed query (causal inside the observation window) over the keys before
    it, averaged over the observed queries, 1-D pooled with zero/-inf padding, then averaged
    over each GQA group; the observed queries' own keys score +inf (SnapKV always keeps them).
    Returns (Hkv, P).
    present (Hkv, P) bool, optional: only these keys exist (the others get no attention and
    score -inf)."""
    num_q_heads, num_observed, head_dim = q_observed.shape
    num_kv_heads, prompt_len, _ = k.shape
    group = num_q_heads // num_kv_heads
    before = prompt_len - num_observed
    per_head = torch.zeros(num_q_heads, before, dtype=torch.float64)
    for head in range(num_q_heads):
        keys = k[head // group].double()
        for i in range(num_observed):
            pos = prompt_len - num_observed + i
            logits = keys[: pos + 1] @ q_observed[head, i].double() / math.sqrt(head_dim)
            if present is not None:
                logits[~present[head // group, : pos + 1]] = -math.inf
            per_head[head] += torch.softmax(logits, dim=0)[:before] / num_observed
    pooled = torch.empty_like(per_head)
    half = kernel // 2
    for j in range(before):
        lo, hi = max(0, j - half), min(before, j + half + 1)
        if pooling == "avg":
            pooled[:, j] = per_head[:, lo:hi].sum(dim=1) / kernel
        else:
            pooled[:, j] = per_head[:, lo:hi].max(dim=1).values
    scores = torch.full((num_kv_heads, prompt_len), math.inf, dtype=torch.float64)
    scores[:, :before] = pooled.view(num_kv_heads, group, before).mean(dim=1)
    if present is not None:
        scores[:, :before][~present[:, :before]] = -math.inf
    return scores


def kept_mask(
    layout: CacheLayout, prompt_len: int, total_len: int, selected: torch.Tensor | None,
    num_layers: int, num_kv_heads: int,
) -> torch.Tensor:
    """allowed[l, h, q, k] for a sequence of ``total_len`` tokens: causal over the prompt; for a
    generated query ``q``: sinks, selected, and ring tokens (the newest ``n_ring`` that entered the
    ring, never older than what prefill kept). selected (L, Hkv, n_topk) when the prompt was
    compressed with SnapKV."""
    q = torch.arange(total_len)[:, None]
    k = torch.arange(total_len)[None, :]
    compressed = layout.compresses(prompt_len)
    ring_floor = prompt_len - layout.n_recent if compressed else layout.ring_start
    in_ring = (k >= ring_floor) & (k > q - layout.n_ring)
    allowed = torch.zeros(num_layers, num_kv_heads, total_len, total_len, dtype=torch.bool)
    for layer in range(num_layers):
        for head in range(num_kv_heads):
            is_kept = k < layout.n_sink
            if compressed and selected is not None:
                is_kept = is_kept | torch.isin(k, selected[layer, head])
            elif not compressed:
                is_kept = is_kept | (k < layout.ring_start)
            generated = (is_kept | in_ring) & (k <= q)
            allowed[layer, head] = torch.where(q < prompt_len, k <= q, generated)
    return allowed


def cache_kept_mask(cache: SequenceCache, total_len: int, num_kv_heads: int) -> torch.Tensor:
    """:func:`kept_mask` of every layer group of ``cache`` (what prefill kept, read from its
    slots), each layer in its group's layout; a sliding group's layers see at most their window
    at every query, prompt and generated alike. Returns allowed (L, Hkv, T, T)."""
    layout = cache.layout
    allowed = torch.zeros(layout.num_layers, num_kv_heads, total_len, total_len,
                          dtype=torch.bool)
    q, k = torch.arange(total_len)[:, None], torch.arange(total_len)[None, :]
    for part in cache.groups:
        group = part.group.layout
        selected = None
        if group.compresses(cache.prompt_len) and group.n_topk:
            selected = part.positions[:, :, group.n_sink : group.ring_start].long()
        mask = kept_mask(group, cache.prompt_len, total_len, selected, len(part.group.layers),
                         num_kv_heads)
        if part.group.window is not None:
            mask &= k > q - part.group.window
        allowed[list(part.group.layers)] = mask
    return allowed


@torch.no_grad()
def masked_logits(
    model: Transformer, ids: list[int], allowed: torch.Tensor, prompt_len: int | None = None,
    kv_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Full-sequence forward where layer l, KV head h may only attend where allowed[l, h];
    queries from ``prompt_len`` on (the decode steps) read K/V rounded to the KV dtype
    ``kv_dtype`` (int8: quantized per row as snapstream.kvquant does; float8_e4m3fn: rounded to
    fp8), as the slot cache holds
    them, the prompt's own queries the exact ones. Returns (T, V) float32
    logits."""
    group = model.config.num_groups
    decoding = len(ids) if prompt_len is None else prompt_len

    def attend(layer_idx: int, q, k, v):
        mask = allowed[layer_idx].repeat_interleave(group, dim=0)[None]  # (1, Hq, T, T)
        k = k.repeat_interleave(group, dim=1)  # (1, Hq, T, D)
        v = v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (1, Hq, T, D)
        stored_k, stored_v = (kv_float(to_kv(x, kv_dtype)).to(x.dtype) for x in (k, v))
        stored = F.scaled_dot_product_attention(q, stored_k, stored_v, attn_mask=mask)
        out[:, :, decoding:] = stored[:, :, decoding:]
        return out

    input_ids = torch.tensor([ids])
    hidden = model(input_ids, torch.arange(len(ids))[None], attend)
    return model.logits(hidden[0])


def record_prefill(model: Transformer, ids: list[int]) -> tuple[list, list]:
    """Rotated queries and keys of every layer for a prompt: L x (Hq, P, D), L x (Hkv, P, D)."""
    queries, keys = [], []

    def attend(layer_idx: int, q, k, v):
        queries.append(q[0])
        keys.append(k[0])
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    with torch.no_grad():
        model(torch.tensor([ids]), torch.arange(len(ids))[None], attend)
    return queries, keys
