"""The draft's side of speculative prefill: how much each prompt token matters to what comes
next, from the draft's attention.

The draft prefills the whole prompt (in its engine's prefill dtype: bfloat16 for the quantized
formats, as any prompt of theirs), then greedily decodes ``look_ahead`` tokens (stopping at an
end token) in the model's own dtype over the prompt's stored K/V, as the engine's decode does.
The query of the last prompt token and of each look-ahead token score every prompt key: softmax
per head (causal, over the prompt and the look-ahead tokens before the query), an average pool
along positions, the max over heads and layers, the mean over queries.
Only those few query rows are ever formed: no (P, P) matrix; the scores are computed in float32
whatever the activations' dtype.

Sliding-window layers do not vote: they were trained to attend within their window only, so
their queries' softmax over a whole long prompt is not attention the model ever pays; their
K/V is kept for the look-ahead decode (only the window's worth). A draft needs at least one
global layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from snapstream.attention import causal_attention
from snapstream.cancel import Cancel, checking
from snapstream.model import Transformer


@dataclass(frozen=True)
class DraftScores:
    scores: torch.Tensor  # (P,) float32, one per draft prompt token
    look_ahead_ids: list[int]  # the tokens the draft decoded after the prompt


@dataclass
class _DraftAttention:
    """The attend callback of the draft: prefill records each layer's K/V (the window's worth
    on sliding layers) and the last prompt query of the voting layers; each decode step appends
    its key and value, attends over what the layer sees and records its query."""

    windows: tuple[int | None, ...]  # per layer; None: global
    voting: frozenset[int]
    capacity: int  # look-ahead tokens that may be appended
    keys: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (Hkv, S, D), the
    # prompt's dtype (a look-ahead step's K/V are stored in it, as a KV cache holds them)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    lengths: dict[int, int] = field(default_factory=dict)  # filled slots per layer
    queries: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # layer -> [(Hq, 1, D)]
    # float32

    def __call__(self, layer_idx: int, q, k, v) -> torch.Tensor:
        if layer_idx not in self.keys:
            return self._prefill(layer_idx, q, k, v)
        return self._decode(layer_idx, q, k, v)

    def _prefill(self, layer_idx: int, q, k, v) -> torch.Tensor:
        window = self.windows[layer_idx]
        out = causal_attention(q, k, v, window)
        held = k[0, :, -window:] if window else k[0]  # (Hkv, S0, D)
        shape = (held.shape[0], held.shape[1] + self.capacity, held.shape[2])
        self.keys[layer_idx] = k.new_empty(shape)
        self.values[layer_idx] = v.new_empty(shape)
        self.keys[layer_idx][:, : held.shape[1]] = held
        self.values[layer_idx][:, : held.shape[1]] = v[0, :, -held.shape[1]:]
        self.lengths[layer_idx] = held.shape[1]
        if layer_idx in self.voting:
            self.queries[layer_idx] = [q[0, :, -1:].float()]  # (Hq, 1, D)
        return out

    def _decode(self, layer_idx: int, q, k, v) -> torch.Tensor:
        end = self.lengths[layer_idx]
        self.keys[layer_idx][:, end] = k[0, :, 0]
        self.values[layer_idx][:, end] = v[0, :, 0]
        self.lengths[layer_idx] = end + 1
        window = self.windows[layer_idx]
        start = max(0, end + 1 - window) if window else 0
        keys = self.keys[layer_idx][None, :, start : end + 1].to(q.dtype)  # (1, Hkv, S, D)
        values = self.values[layer_idx][None, :, start : end + 1].to(q.dtype)
        if layer_idx in self.voting:
            self.queries[layer_idx].append(q[0].float())  # (Hq, 1, D)
        return F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)


def voting_layers(windows: tuple[int | None, ...]) -> frozenset[int]:
    """The global layers (ValueError when there is none)."""
    full = frozenset(i for i, w in enumerate(windows) if w is None)
    if not full:
        raise ValueError("draft model: every layer is a sliding-window layer; speculative "
                         "prefill needs a draft with global attention layers")
    return full


@torch.no_grad()
def score_prompt(model: Transformer, ids: list[int], look_ahead: int, kernel: int,
                 stop_ids: set[int], prefill_dtype: torch.dtype | None = None,
                 cancel: Cancel | None = None) -> DraftScores:
    """Importance of every token of ``ids`` (the draft's own tokens) to the draft's next
    ``look_ahead`` greedy tokens (fewer when one of ``stop_ids`` comes first).
    ``prefill_dtype``: the prompt forward's activations (an Engine's ``prefill_dtype``; None:
    the model's own); ``cancel``: checked before each layer of every forward."""
    windows = model.config.attention_windows
    attention = _DraftAttention(windows, voting_layers(windows), capacity=look_ahead)
    attend = checking(attention, cancel)
    device = model.lm_head.weight.device
    hidden = model(torch.tensor([ids], device=device), torch.arange(len(ids), device=device)[None],
                   attend, prefill_dtype)  # (1, P, hidden)
    token = int(model.logits(hidden[0, -1].to(model.model.norm.weight.dtype)).argmax())
    generated: list[int] = []
    while len(generated) < look_ahead and token not in stop_ids:
        if cancel is not None:
            cancel.check()
        generated.append(token)
        position = torch.tensor([[len(ids) + len(generated) - 1]], device=device)
        hidden = model(torch.tensor([[token]], device=device), position, attend)
        token = int(model.logits(hidden[0, -1]).argmax())
    scores = torch.stack([_layer_scores(torch.cat(attention.queries[i], dim=1),
                                        attention.keys[i][:, : attention.lengths[i]],
                                        len(ids), kernel)
                          for i in sorted(attention.voting)])  # (Lv, Q, P)
    return DraftScores(scores=scores.amax(dim=0).mean(dim=0), look_ahead_ids=generated)


def _layer_scores(q: torch.Tensor, k: torch.Tensor, prompt_len: int, kernel: int
                  ) -> torch.Tensor:
    """q (Hq, Q, D): the queries at positions P-1 .. P-2+Q; k (Hkv, P+Q-1, D) (or one more)
    -> (Q, P): each query's softmax over the keys it sees, pooled, max over heads."""
    num_q_heads, num_queries, head_dim = q.shape
    num_kv_heads, num_keys = k.shape[0], k.shape[1]
    group = num_q_heads // num_kv_heads
    grouped = q.reshape(num_kv_heads, group * num_queries, head_dim)  # (Hkv, G*Q, D)
    logits = grouped @ k.float().transpose(1, 2) / math.sqrt(head_dim)  # (Hkv, G*Q, S)
    logits = logits.view(num_q_heads, num_queries, num_keys)  # (Hq, Q, S)
    query_pos = torch.arange(prompt_len - 1, prompt_len - 1 + num_queries, device=k.device)
    future = torch.arange(num_keys, device=k.device)[None] > query_pos[:, None]  # (Q, S)
    probs = logits.masked_fill(future, float("-inf")).softmax(dim=-1)[..., :prompt_len]
    width = min(kernel, 2 * prompt_len - 1)
    pooled = F.avg_pool1d(probs.reshape(-1, 1, prompt_len), width, stride=1,
                          padding=width // 2)  # (Hq*Q, 1, P)
    return pooled.view(num_q_heads, num_queries, prompt_len).amax(dim=0)  # (Q, P)
