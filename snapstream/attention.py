"""Attention over a fixed-shape slot cache (decode) and the prefill attention that records K/V."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import snapstream._kernels  # noqa: F401  (registers torch.ops.snapstream.slot_attention)
from snapstream.compress import compress_kv
from snapstream.kvcache import SequenceCache
from snapstream.policy import CacheLayout
from snapstream.snapkv import snapkv_scores


def slot_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, empty: torch.Tensor
) -> torch.Tensor:
    """One query per row over every slot of its cache.

    q (B, Hq, 1, D) in the activations' dtype; k, v (B, Hkv, S, D) in the cache's (float32
    or bfloat16, read as stored, never widened in memory); empty (B, S) bool, True where a
    slot holds no token -> (B, Hq, 1, D) in q's dtype. Which slots hold a token is the same
    for every layer and KV head (the layout fills them alike), so one mask per step serves all
    of them. Runs the op ``snapstream::slot_attention``: the compiled kernel on the CPU
    (snapstream/csrc), :func:`grouped_slot_attention` on other devices.
    """
    out = torch.ops.snapstream.slot_attention(q[:, :, 0].float(), k, v, empty)  # (B, Hq, D)
    return out.to(q.dtype)[:, :, None]


def grouped_slot_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, empty: torch.Tensor
) -> torch.Tensor:
    """The op on devices without a kernel of their own: q (B, Hq, D) float32; k, v and empty
    as :func:`slot_attention` takes them -> (B, Hq, D) float32. A KV head's G query heads share
    one matmul over its keys (GQA without repeating them), in the cache's dtype with float32
    accumulation; the softmax in float32."""
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    q_groups = (q * D**-0.5).view(B, Hkv, Hq // Hkv, D).to(k.dtype)  # (B, Hkv, G, D)
    scores = torch.matmul(q_groups, k.transpose(-1, -2)).float()  # (B, Hkv, G, S)
    probs = torch.softmax(scores.masked_fill_(empty[:, None, None], float("-inf")), dim=-1)
    out = torch.matmul(probs.to(v.dtype), v)  # (B, Hkv, G, D)
    return out.float().view(B, Hq, D)


_OTHER_DEVICES = torch.library.Library("snapstream", "IMPL")  # kept: it holds the registration
_OTHER_DEVICES.impl("slot_attention", grouped_slot_attention, "CompositeExplicitAutograd")


@torch.library.register_fake("snapstream::slot_attention")
def _slot_attention_shape(q, k, v, empty):
    return q.new_empty(q.shape)


@dataclass
class PrefillRecorder:
    """Causal attention for one prompt that compresses each layer's K/V into ``layout`` as soon
    as the layer has run, scoring with SnapKV when ``window`` > 0 (the window queries are never
    stored): a prompt holds one layer's whole K/V at a time, beside the compressed layers."""

    layout: CacheLayout
    dtype: torch.dtype  # of the compressed K/V
    window: int = 0  # 0: no SnapKV scores
    kernel: int = 1
    pooling: str = "avg"
    keys: list[torch.Tensor] = field(default_factory=list)  # L x (Hkv, S, D)
    values: list[torch.Tensor] = field(default_factory=list)
    positions: list[torch.Tensor] = field(default_factory=list)  # L x (Hkv, S) int32
    select_s: float = 0.0  # time spent scoring and compressing

    def __call__(self, layer_idx: int, q, k, v) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        start = time.perf_counter()
        scores = None
        if self.window:
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
