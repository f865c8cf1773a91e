"""An :class:`Engine` that runs a prompt's full-attention forward once for all its policies.

The prompt's K/V do not depend on the cache policy, and SnapKV's scores depend only on
``(window, kernel, pooling)``. :meth:`SharedPrefillEngine.prefill` therefore keeps the forward
of the latest prompt, one per distinct scoring triple, and compresses it into each policy's
layout the way :meth:`Engine.prefill` does; :meth:`Engine.generate` runs unchanged on top, so
every policy decodes exactly as in serving.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from snapstream.attention import PrefillRecorder
from snapstream.compress import build_sequence_cache
from snapstream.engine import Engine, PrefillResult
from snapstream.policy import CachePolicy


@dataclass(frozen=True)
class Forward:
    """One full-attention pass over a prompt."""

    keys: torch.Tensor  # (L, Hkv, P, D)
    values: torch.Tensor  # (L, Hkv, P, D)
    scores: torch.Tensor  # (L, Hkv, P) SnapKV scores for one (window, kernel, pooling)
    logits: torch.Tensor  # (V,) next-token logits after the last prompt token
    seconds: float


class SharedPrefillEngine(Engine):
    """``Engine`` whose prefill reuses the forward of the previous call on the same prompt."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._ids: list[int] = []
        self._forwards: dict[tuple[int, int, str], Forward] = {}

    @torch.no_grad()
    def forward(self, ids: list[int], policy: CachePolicy) -> Forward:
        """The (cached) forward of ``ids`` scored with ``policy``'s SnapKV settings."""
        if ids != self._ids:
            self._ids, self._forwards = list(ids), {}
        key = (min(policy.window, len(ids)), policy.kernel, policy.pooling)
        if key not in self._forwards:
            self._forwards[key] = self._run_forward(ids, *key)
        return self._forwards[key]

    def _run_forward(self, ids: list[int], window: int, kernel: int, pooling: str) -> Forward:
        recorder = PrefillRecorder(window=window, kernel=kernel, pooling=pooling)
        start = time.perf_counter()
        input_ids = torch.tensor([ids], device=self.device)  # (1, P)
        positions = torch.arange(len(ids), device=self.device)[None]  # (1, P)
        hidden = self.model(input_ids, positions, recorder)  # (1, P, hidden)
        logits = self.model.logits(hidden[0, -1])  # (V,)
        return Forward(keys=torch.stack(recorder.keys), values=torch.stack(recorder.values),
                       scores=torch.stack(recorder.scores), logits=logits,
                       seconds=time.perf_counter() - start)

    @torch.no_grad()
    def prefill(self, ids: list[int], policy: CachePolicy, max_new_tokens: int,
                capacity: int | None = None) -> PrefillResult:
        self.check_prompt(ids)
        policy.check_context(self.context_len)
        forward = self.forward(ids, policy)
        layout = policy.layout(len(ids), max_new_tokens, capacity)
        start = time.perf_counter()
        cache = build_sequence_cache(layout, forward.keys, forward.values, forward.scores)
        select_s = time.perf_counter() - start
        return PrefillResult(cache=cache, logits=forward.logits,
                             prefill_s=forward.seconds + select_s, select_s=select_s)
