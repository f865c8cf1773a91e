"""A prompt's full-attention forward, run once and compressed into any policy's layout.

The prompt's K/V do not depend on the cache policy, and SnapKV's scores depend only on
``(observation, kernel, pooling, observe, unit)`` and the last ``observation`` queries of each
layer (and a probe's, :mod:`snapstream.probe`; the prompt's spans, :mod:`snapstream.units`).
A :class:`PromptForward` keeps K/V and the last ``max_observation`` queries, with a probe's
after them when given one (run in the same forward, as prefill runs it), computes scores for a
key when first asked, and builds the same
:class:`SequenceCache` as :meth:`Engine.prefill` (same attention call, windowed on a hybrid
model's sliding layers; same scoring function; same placement).
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
from snapstream.units import keep_whole


@dataclass
class _Recorder:
    """Causal attention that keeps every layer's K/V and its last ``max_observation`` queries."""

    max_observation: int  # of the prompt's queries kept, before the probe's
    windows: tuple[int | None, ...]  # per layer: its sliding window, None for a global layer
    probe: int = 0  # the forward's last tokens that are a probe
    keys: list[torch.Tensor] = field(default_factory=list)  # L x (Hkv, P, D)
    values: list[torch.Tensor] = field(default_factory=list)
    queries: list[torch.Tensor] = field(default_factory=list)  # L x (Hq, W, D)

    def __call__(self, layer_idx: int, q, k, v) -> torch.Tensor:
        self.keys.append(k[0])
        self.values.append(v[0])
        # a copy: a view of the last queries would keep the layer's every query alive
        self.queries.append(q[0, :, -(self.max_observation + self.probe) :].clone())
        return causal_attention(q, k, v, self.windows[layer_idx])


@dataclass
class PromptForward:
    keys: torch.Tensor  # (L, Hkv, P + A, D): the prompt's, then the probe's
    values: torch.Tensor  # (L, Hkv, P + A, D)
    queries: list[torch.Tensor]  # L x (Hq, O + A, D), the last max_observation prompt queries
    logits: torch.Tensor  # (V,) next-token logits after the last prompt token
    seconds: float
    windows: tuple[int | None, ...]  # the model's attention_windows
    probe: int = 0  # A: the probe's tokens, run after the prompt
    # unit -> the prompt's spans (P,) SnapKV keeps whole under it (units.unit_spans)
    spans: dict[str, torch.Tensor | None] = field(default_factory=lambda: {"token": None})
    _scores: dict[tuple[int, int, str, bool, str], torch.Tensor] = field(default_factory=dict)

    @classmethod
    @torch.no_grad()
    def run(cls, model: Transformer, ids: list[int], max_observation: int,
            probe: list[int] = (), spans: dict[str, torch.Tensor | None] | None = None
            ) -> PromptForward:
        """The forward of ``ids`` and then ``probe`` (the tokens a policy that observes
        ``"opening"`` reads again after the prompt, :func:`snapstream.probe.probe_ids`);
        ``spans``: the units the runs keep besides tokens, with the prompt's spans of each."""
        recorder = _Recorder(max_observation=max_observation,
                             windows=model.config.attention_windows, probe=len(probe))
        device = model.lm_head.weight.device
        start = time.perf_counter()
        input_ids = torch.tensor([[*ids, *probe]], device=device)  # (1, P + A)
        positions = torch.arange(input_ids.shape[1], device=device)[None]  # (1, P + A)
        hidden = model(input_ids, positions, recorder)  # (1, P + A, hidden)
        logits = model.logits(hidden[0, len(ids) - 1])  # (V,)
        return cls(keys=torch.stack(recorder.keys), values=torch.stack(recorder.values),
                   queries=recorder.queries, logits=logits,
                   seconds=time.perf_counter() - start, windows=recorder.windows,
                   probe=len(probe), spans={"token": None, **(spans or {})})

    @property
    def prompt_len(self) -> int:
        return self.keys.shape[2] - self.probe

    @torch.no_grad()
    def scores(self, observation: int, kernel: int, pooling: str, observe: str = "last",
               unit: str = "token") -> torch.Tensor:
        """(L, Hkv, P) SnapKV scores of the last ``observation`` prompt queries (at most those
        kept), and under ``observe="opening"`` the probe's after them; each span of ``unit``
        scoring its best."""
        observation = min(observation, self.prompt_len)
        kept = self.queries[0].shape[1] - self.probe  # the prompt's queries kept
        if observation > kept:
            raise ValueError(f"observation {observation} exceeds the {kept} queries this "
                             "forward kept (its max_observation)")
        probed = observe == "opening"
        if probed and not self.probe:
            raise ValueError("observe='opening' needs a forward run with its probe")
        if unit not in self.spans:
            raise ValueError(f"unit={unit!r} needs a forward run with the prompt's spans of it")
        key = (observation, kernel, pooling, probed, unit)
        if key not in self._scores:
            extra = self.probe if probed else 0  # the probe's keys and queries, or none
            end = kept + extra
            scores = torch.stack([
                snapkv_scores(q[:, end - observation - extra : end],
                              k[:, : self.prompt_len + extra], kernel,
                              pooling)[:, : self.prompt_len]
                for q, k in zip(self.queries, self.keys, strict=True)])  # (L, Hkv, P)
            spans = self.spans[unit]
            self._scores[key] = scores if spans is None else keep_whole(scores, spans)
        return self._scores[key]

    def sequence_cache(self, policy: CachePolicy, max_new_tokens: int,
                       capacity: int | None = None) -> SequenceCache:
        """What :meth:`Engine.prefill` would build for this prompt and ``policy``."""
        layout = policy.layout(self.prompt_len, max_new_tokens, capacity)
        groups = ModelLayout.build(self.windows, layout)
        selects = layout.compresses(self.prompt_len) and layout.n_topk > 0
        scores = self.scores(policy.observation, policy.kernel, policy.pooling,
                             policy.observe, policy.unit) if selects else None
        prompt = slice(0, self.prompt_len)
        return build_sequence_cache(groups, self.keys[:, :, prompt], self.values[:, :, prompt],
                                    scores)
