"""A prompt's full-attention forward, run once and compressed into any policy's layout.

The prompt's K/V do not depend on the cache policy, and SnapKV's scores depend only on
``(observation, kernel, pooling)`` and the last ``observation`` queries of each layer. A
:class:`PromptForward` keeps K/V and the last ``max_observation`` queries, computes scores for a
triple when first asked, and builds the same :class:`SequenceCache` as :meth:`Engine.prefill`
(same attention call, windowed on a hybrid model's sliding layers; same scoring function;
same placement).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from snapstream.attention import causal_attention
from snapstream.compress import build_sequence_cache
from snapstream.kvcache import ModelLayout, SequenceCache
from snapstream.model import Transformer
from snapstream.policy import CachePolicy
from snapstream.snapkv import snapkv_scores


@dataclass
class _Recorder:
    """Causal attention that keeps every layer's K/V and its last ``max_observation`` queries."""

    max_observation: int
    windows: tuple[int | None, ...]  # per layer: its sliding window, None for a global layer
    keys: list[torch.Tensor] = field(default_factory=list)  # L x (Hkv, P, D)
    values: list[torch.Tensor] = field(default_factory=list)
    queries: list[torch.Tensor] = field(default_factory=list)  # L x (Hq, W, D)

    def __call__(self, layer_idx: int, q, k, v) -> torch.Tensor:
        self.keys.append(k[0])
        self.values.append(v[0])
        # a copy: a view of the last queries would keep the layer's every query alive
        self.queries.append(q[0, :, -self.max_observation :].clone())
        return causal_attention(q, k, v, self.windows[layer_idx])


@dataclass
class PromptForward:
    keys: torch.Tensor  # (L, Hkv, P, D)
    values: torch.Tensor  # (L, Hkv, P, D)
    queries: list[torch.Tensor]  # L x (Hq, O, D), the last max_observation prompt queries
    logits: torch.Tensor  # (V,) next-token logits after the last prompt token
    seconds: float
    windows: tuple[int | None, ...]  # the model's attention_windows
    _scores: dict[tuple[int, int, str], torch.Tensor] = field(default_factory=dict)

    @classmethod
    @torch.no_grad()
    def run(cls, model: Transformer, ids: list[int], max_observation: int) -> PromptForward:
        recorder = _Recorder(max_observation=max_observation,
                             windows=model.config.attention_windows)
        device = model.lm_head.weight.device
        start = time.perf_counter()
        input_ids = torch.tensor([ids], device=device)  # (1, P)
        positions = torch.arange(len(ids), device=device)[None]  # (1, P)
        hidden = model(input_ids, positions, recorder)  # (1, P, hidden)
        logits = model.logits(hidden[0, -1])  # (V,)
        return cls(keys=torch.stack(recorder.keys), values=torch.stack(recorder.values),
                   queries=recorder.queries, logits=logits,
                   seconds=time.perf_counter() - start, windows=recorder.windows)

    @property
    def prompt_len(self) -> int:
        return self.keys.shape[2]

    @torch.no_grad()
    def scores(self, observation: int, kernel: int, pooling: str) -> torch.Tensor:
        """(L, Hkv, P) SnapKV scores of the last ``observation`` queries (at most those kept)."""
        observation = min(observation, self.prompt_len)
        if observation > self.queries[0].shape[1]:
            raise ValueError(f"observation {observation} exceeds the {self.queries[0].shape[1]} "
                             "queries this forward kept (its max_observation)")
        key = (observation, kernel, pooling)
        if key not in self._scores:
            self._scores[key] = torch.stack([
                snapkv_scores(q[:, -observation:], k, kernel, pooling)
                for q, k in zip(self.queries, self.keys, strict=True)])
        return self._scores[key]

    def sequence_cache(self, policy: CachePolicy, max_new_tokens: int,
                       capacity: int | None = None) -> SequenceCache:
        """What :meth:`Engine.prefill` would build for this prompt and ``policy``."""
        layout = policy.layout(self.prompt_len, max_new_tokens, capacity)
        groups = ModelLayout.build(self.windows, layout)
        selects = layout.compresses(self.prompt_len) and layout.n_topk > 0
        scores = self.scores(policy.observation, policy.kernel, policy.pooling) if selects else None
        return build_sequence_cache(groups, self.keys, self.values, scores)
