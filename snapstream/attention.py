"""Attention: causal attention over a prompt, attention over a fixed-shape slot cache (decode),
and the prefill attention that records K/V."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from snapstream import kernels
from snapstream.compress import compress_kv
from snapstream.kvcache import GroupKV, ModelLayout, SequenceCache
from snapstream.snapkv import snapkv_scores
from snapstream.units import keep_whole


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     window: int | None = None, positions: torch.Tensor | None = None,
                     outputs: int | None = None) -> torch.Tensor:
    """q (B, Hq, T, D), k/v (B, Hkv, T, D) of one forward -> (B, Hq, T, D): each query over the
    keys up to its own; with a ``window``, only the keys whose position lies within it
    (q_pos - window < k_pos <= q_pos). ``positions`` (T,) ascending: the tokens' positions when
    they are not 0..T-1 (kept tokens of a longer prompt). No (T, T) matrix is ever made: where
    ``kernels.prompt_attention_covers`` (float32 on an AVX-512 CPU, bfloat16 on an AVX512-BF16
    one without AMX) snapstream's flash kernel runs, windows included; elsewhere torch's flash
    SDPA, a window block by block. ``outputs``: only the last ``outputs`` queries' results,
    (B, Hq, outputs, D), by one masked SDPA over their keys (None: every query's)."""
    if outputs is not None and outputs < q.shape[2]:
        return last_queries_attention(q[:, :, -outputs:], k, v, window, positions)
    if kernels.prompt_attention_covers(q):
        return kernels.prompt_attention(q, k, v, window or 0, positions)
    num_tokens = q.shape[2]
    at = torch.arange(num_tokens, device=q.device) if positions is None else positions  # (T,)
    if window is None or int(at[-1] - at[0]) < window:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    starts = torch.arange(0, num_tokens, window, device=q.device)  # (Nb,)
    lows = torch.searchsorted(at, at[starts] - window + 1)  # first key in each block's window
    out = torch.empty_like(q)
    for start, low in zip(starts.tolist(), lows.tolist(), strict=True):
        end = min(start + window, num_tokens)  # queries [start, end), keys [low, end)
        query_pos, key_pos = at[start:end, None], at[None, low:end]  # (Tq, 1), (1, Tk)
        mask = (key_pos <= query_pos) & (key_pos > query_pos - window)  # (Tq, Tk)
        out[:, :, start:end] = F.scaled_dot_product_attention(
            q[:, :, start:end], k[:, :, low:end], v[:, :, low:end], attn_mask=mask,
            enable_gqa=True)
    return out


def last_queries_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           window: int | None = None, positions: torch.Tensor | None = None
                           ) -> torch.Tensor:
    """q (B, Hq, Tq, D) of the last Tq of the T tokens of k/v (B, Hkv, T, D) -> (B, Hq, Tq, D):
    causal attention, ``window`` and ``positions`` as in :func:`causal_attention`."""
    num_queries, num_keys = q.shape[2], k.shape[2]
    at = torch.arange(num_keys, device=q.device) if positions is None else positions  # (T,)
    low = 0 if window is None else int(torch.searchsorted(at, at[-num_queries] - window + 1))
    query_pos, key_pos = at[-num_queries:, None], at[None, low:]  # (Tq, 1), (1, T - low)
    mask = key_pos <= query_pos
    if window is not None:
        mask &= key_pos > query_pos - window
    return F.scaled_dot_product_attention(q, k[:, :, low:], v[:, :, low:], attn_mask=mask,
                                          enable_gqa=True)


def slot_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_new: torch.Tensor,
    v_new: torch.Tensor, slots: torch.Tensor, empty: torch.Tensor,
) -> torch.Tensor:
    """Writes this step's keys and values into each row's slot, then one query per row attends
    over every slot of its cache.

    q, k_new, v_new (B, H*, 1, D) in the activations' dtype; k, v (B, Hkv, S, W) in the cache's
    KV dtype (float32, bfloat16, or int8 rows of codes + scale, W = D + 4: read as stored,
    never widened in memory; :mod:`snapstream.kvquant`), updated in place; slots
    (B,) int64; empty (B, S) bool, True where a slot holds no token -> (B, Hq, 1, D) in q's
    dtype. Which slots hold a token is the same for every layer and KV head of a layer group
    (its layout fills them alike), so one mask per group and step serves all of them. Runs the op
    ``snapstream::slot_attention`` (:mod:`snapstream.kernels`).
    """
    out = kernels.slot_attention(q[:, :, 0].float(), k, v, k_new[:, :, 0], v_new[:, :, 0],
                                 slots, empty)  # (B, Hq, D)
    return out.to(q.dtype)[:, :, None]


@dataclass
class PrefillRecorder:
    """Causal attention for one prompt that compresses each layer's K/V into its group's layout
    as soon as the layer has run, scoring the global layers with SnapKV when ``observation`` > 0
    (the observed queries are never stored): a prompt holds one layer's whole K/V at a time,
    beside the
    compressed layers. A sliding-window layer attends within its window and keeps the last
    ``window`` tokens (its group's ring), never scored. ``positions``: the prompt tokens'
    positions when they are the kept part of a longer prompt (a window is one of positions).
    ``outputs``: the final layer's attention returns only the last ``outputs`` positions (the
    prefill reads the last position's hidden state alone, so the rest of that layer's
    attention, output projection and MLP is skipped; its K/V and SnapKV scores are whole);
    None: every position's. ``probe``: the forward's last ``probe`` tokens are a probe run after
    the prompt (:mod:`snapstream.probe`): among the observed queries, never kept, no candidates.
    ``spans``: (P,) the prompt's spans that SnapKV keeps whole (:mod:`snapstream.units`); None:
    every token alone."""

    layout: ModelLayout
    dtype: torch.dtype  # of the compressed K/V
    positions: torch.Tensor | None = None  # (P,) ascending; None: 0..P-1
    observation: int = 0  # SnapKV's observed queries; 0: no SnapKV scores
    outputs: int | None = None  # rows the final layer returns; None: all
    kernel: int = 1
    pooling: str = "avg"
    probe: int = 0
    spans: torch.Tensor | None = None  # (P,)
    kept: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict)  # layer -> K, V, pos
    select_s: float = 0.0  # time spent scoring and compressing

    def __post_init__(self) -> None:
        self._group_of = {i: group for group in self.layout.groups for i in group.layers}
        self._final = max(self._group_of)

    def __call__(self, layer_idx: int, q, k, v) -> torch.Tensor:
        group = self._group_of[layer_idx]
        outputs = self.outputs if layer_idx == self._final else None
        out = causal_attention(q, k, v, group.window, self.positions, outputs)
        start = time.perf_counter()
        scores = None
        prompt_len = k.shape[2] - self.probe
        if self.observation and group.window is None:
            q_observed = q[0, :, -self.observation :]  # (Hq, O, D)
            scores = snapkv_scores(q_observed, k[0], self.kernel, self.pooling
                                   )[None, :, :prompt_len]  # (1, Hkv, P)
            if self.spans is not None:
                scores = keep_whole(scores, self.spans)
        kept = compress_kv(group.layout, k[:, :, :prompt_len], v[:, :, :prompt_len], scores,
                           self.dtype)  # K, V (1, Hkv, S, D), pos
        self.kept[layer_idx] = tuple(tensor[0] for tensor in kept)
        self.select_s += time.perf_counter() - start
        return out

    def cache(self, prompt_len: int) -> SequenceCache:
        parts = tuple(
            GroupKV(group, *(torch.stack([self.kept[i][part] for i in group.layers])
                             for part in range(3)))  # (Lg, Hkv, S, D) x 2, (Lg, Hkv, S)
            for group in self.layout.groups)
        return SequenceCache(parts, prompt_len=prompt_len, next_position=prompt_len)
