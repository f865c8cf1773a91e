"""Attention over a fixed-shape slot cache (decode) and the prefill attention that records K/V."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from snapstream import kernels
from snapstream.compress import compress_kv
from snapstream.kvcache import SequenceCache
from snapstream.model import causal_attention
from snapstream.policy import CacheLayout
from snapstream.snapkv import snapkv_scores


def slot_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_new: torch.Tensor,
    v_new: torch.Tensor, slots: torch.Tensor, empty: torch.Tensor,
) -> torch.Tensor:
    """Writes this step's keys and values into each row's slot, then one query per row attends
    over every slot of its cache.

    q, k_new, v_new (B, H*, 1, D) in the activations' dtype; k, v (B, Hkv, S, D) in the cache's
    (float32 or bfloat16, read as stored, never widened in memory), updated in place; slots
    (B,) int64; empty (B, S) bool, True where a slot holds no token -> (B, Hq, 1, D) in q's
    dtype. Which slots hold a token is the same for every layer and KV head (the layout fills
    them alike), so one mask per step serves all of them. Runs the op
    ``snapstream::slot_attention`` (:mod:`snapstream.kernels`).
    """
    out = kernels.slot_attention(q[:, :, 0].float(), k, v, k_new[:, :, 0], v_new[:, :, 0],
                                 slots, empty)  # (B, Hq, D)
    return out.to(q.dtype)[:, :, None]


@dataclass
class PrefillRecorder:
    """Causal attention for one prompt that compresses each layer's K/V into ``layout`` as soon
    as the layer has run, scoring with SnapKV when ``window`` > 0 (the window queries are never
    stored): a prompt holds one layer's whole K/V at a time, beside the compressed layers.

    A sliding-window layer (``attention_windows``) attends within its window and, where the
    layout selects, keeps its latest tokens instead of SnapKV's picks: every slot it holds is
    then one the decode step's window mask can use, the same for all its heads."""

    layout: CacheLayout
    dtype: torch.dtype  # of the compressed K/V
    window: int = 0  # 0: no SnapKV scores
    kernel: int = 1
    pooling: str = "avg"
    attention_windows: tuple[int | None, ...] = ()  # per layer; () or None: full attention
    keys: list[torch.Tensor] = field(default_factory=list)  # L x (Hkv, S, D)
    values: list[torch.Tensor] = field(default_factory=list)
    positions: list[torch.Tensor] = field(default_factory=list)  # L x (Hkv, S) int32
    select_s: float = 0.0  # time spent scoring and compressing

    def __call__(self, layer_idx: int, q, k, v) -> torch.Tensor:
        sliding = self.attention_windows[layer_idx] if self.attention_windows else None
        out = causal_attention(q, k, v, sliding)
        start = time.perf_counter()
        scores = None
        if self.window and sliding is not None:  # the latest tokens score highest
            scores = torch.arange(k.shape[2], dtype=torch.float32).expand(1, k.shape[1], -1)
        elif self.window:
            q_window = q[0, :, -self.window :]  # (Hq, W, D)
            scores = snapkv_scores(q_window, k[0], self.kernel, self.pooling)[None]  # (1, Hkv, P)
        kept_k, kept_v, kept_pos = compress_kv(self.layout, k, v, scores, self.dtype)
        self.keys.append(kept_k[0])
        self.values.append(kept_v[0])
        self.positions.append(kept_pos[0])
        self.select_s += time.perf_counter() - start
        return out

    def cache(self, prompt_len: int) -> SequenceCache:
        return SequenceCache(layout=self.layout, k=torch.stack(self.keys),
                             v=torch.stack(self.values), positions=torch.stack(self.positions),
                             prompt_len=prompt_len, next_position=prompt_len)
