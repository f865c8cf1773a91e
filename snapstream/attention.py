"""Attention over a fixed-shape slot cache (decode) and the prefill attention that records K/V."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from snapstream.snapkv import snapkv_scores


def slot_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """One query per row over every slot of its cache, as one fused kernel.

    q (B, Hq, 1, D); k, v (B, Hkv, S, D); valid (B, 1, 1, S) bool -> (B, Hq, 1, D).
    Which slots hold a token is the same for every layer and KV head (the layout fills them
    alike), so one mask per step serves all of them; GQA without repeating keys.
    """
    return F.scaled_dot_product_attention(q, k, v, attn_mask=valid, enable_gqa=True)


@dataclass
class PrefillRecorder:
    """Causal attention for one prompt that keeps every layer's K/V and, when asked, its SnapKV
    scores (computed layer by layer, so the window queries are never stored)."""

    window: int = 0  # 0: no SnapKV scores
    kernel: int = 1
    pooling: str = "avg"
    keys: list[torch.Tensor] = field(default_factory=list)  # L x (Hkv, P, D)
    values: list[torch.Tensor] = field(default_factory=list)
    scores: list[torch.Tensor] = field(default_factory=list)  # L x (Hkv, P)
    score_s: float = 0.0  # time spent scoring


    def __call__(self, layer_idx: int, q, k, v) -> torch.Tensor:
        self.keys.append(k[0])
        self.values.append(v[0])
        if self.window:
            start = time.perf_counter()
            q_window = q[0, :, -self.window :]  # (Hq, W, D)
            self.scores.append(snapkv_scores(q_window, k[0], self.kernel, self.pooling))
            self.score_s += time.perf_counter() - start
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
