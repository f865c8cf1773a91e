"""Compress once, ask many: a document's question-agnostic cache, and prompts prefilled on it.

Store time (:func:`compress_document`): the document is prefilled, then scored without any
question by a scorer of :mod:`snapstream.prefix_scores` (the worker's ``--prefix-score``;
surprisal by default). The cache keeps a *superset* of what a request's layout holds
(:func:`store_layout`): its sinks, ``superset`` x its ``n_topk`` by that score, and the
document's last ``n_recent`` tokens.

Question time (:func:`prefill_on_prefix`): only the rest of the prompt (the suffix) runs; its
queries attend to the stored keys (at their original positions, already rotated) and causally
to each other. Each layer then compresses into the request's layout exactly as a whole prompt
would be (``compress_kv``), with the stored keys and the suffix's as the only candidates and
SnapKV's window (the suffix's last queries, so the question's) picking the final ``n_topk``
among them. A document short enough to be stored whole gives the same cache as a full prefill.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from snapstream.compress import compress_kv
from snapstream.kvcache import EMPTY, GroupKV, LayerGroup, SequenceCache
from snapstream.kvquant import kv_float
from snapstream.model import Transformer, causal_attention
from snapstream.policy import CacheLayout, CachePolicy
from snapstream.prefix_scores import SCORERS, DocumentCacheConfig, DocumentPass, attend_with_prefix
from snapstream.snapkv import snapkv_scores


def store_layout(layout: CacheLayout, config: DocumentCacheConfig) -> CacheLayout:
    """What a document's stored cache holds for requests of ``layout``: its sinks, a superset
    of its SnapKV picks, and the last ``n_recent`` document tokens (the ring's reach when the
    question is short)."""
    return CacheLayout(layout.n_sink, config.superset * layout.n_topk, layout.n_recent,
                       layout.n_recent)


def check_model(model: Transformer) -> None:
    if any(model.config.attention_windows):
        raise ValueError("cache_prefix is not supported for models with sliding-window layers; "
                         "send the request without it")


def check_policy(policy: CachePolicy) -> None:
    if not policy.spec.is_sized:
        raise ValueError(f"cache_prefix needs a policy that bounds the cache (snapstream, "
                         f"snapkv, streaming), not {policy.kind!r}")


@dataclass
class _FullRecorder:
    """Causal attention that keeps every layer's whole K/V (the document's, for scoring)."""

    keys: list[torch.Tensor] = field(default_factory=list)  # L x (Hkv, P, D)
    values: list[torch.Tensor] = field(default_factory=list)

    def __call__(self, layer_idx: int, q, k, v) -> torch.Tensor:
        self.keys.append(k[0])
        self.values.append(v[0])
        return causal_attention(q, k, v)


@torch.no_grad()
def compress_document(model: Transformer, doc_ids: list[int], instruction_ids: list[int],
                      layout: CacheLayout, config: DocumentCacheConfig, kv_dtype: torch.dtype,
                      dtype: torch.dtype | None = None) -> SequenceCache:
    """The document's stored cache in :func:`store_layout` of ``layout``: whole when it fits,
    else scored by ``config.score``. Slots past a short document's tokens stay EMPTY.
    ``dtype``: the activations of the document's forward (the engine's prefill dtype)."""
    check_model(model)
    stored = store_layout(layout, config)
    device = model.lm_head.weight.device
    recorder = _FullRecorder()
    hidden = model(torch.tensor([doc_ids], device=device),
                   torch.arange(len(doc_ids), device=device)[None], recorder, dtype)
    k, v = torch.stack(recorder.keys), torch.stack(recorder.values)  # (L, Hkv, P, D)
    scores = None
    if stored.compresses(len(doc_ids)) and stored.n_topk > 0:
        doc = DocumentPass(model, doc_ids, recorder.keys, recorder.values, hidden[0],
                           instruction_ids)
        scores = SCORERS[config.score](doc)  # (L, Hkv, P)
    out_k, out_v, out_pos = compress_kv(stored, k, v, scores, kv_dtype)
    return _one_group(stored, out_k, out_v, out_pos, len(doc_ids))


def _one_group(layout: CacheLayout, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               prompt_len: int) -> SequenceCache:
    """k, v (L, Hkv, S, D), positions (L, Hkv, S) of a model without sliding layers (one layer
    group, :func:`check_model`) -> its cache of ``prompt_len`` tokens."""
    group = LayerGroup(tuple(range(k.shape[0])), layout)
    return SequenceCache((GroupKV(group, k, v, positions),), prompt_len, prompt_len)


@dataclass
class _SuffixRecorder:
    """Attention of the suffix over the stored document + itself, compressing each layer into
    ``layout`` from the stored keys and the suffix's (a dense prompt with the absent keys
    zeroed and never picked)."""

    prefix: SequenceCache
    layout: CacheLayout
    dtype: torch.dtype
    window: int  # 0: no SnapKV scores
    kernel: int
    pooling: str
    keys: list[torch.Tensor] = field(default_factory=list)  # L x (Hkv, S, D)
    values: list[torch.Tensor] = field(default_factory=list)
    positions: list[torch.Tensor] = field(default_factory=list)  # L x (Hkv, S) int32

    def __call__(self, layer_idx: int, q, k, v) -> torch.Tensor:
        (stored,) = self.prefix.groups
        stored_pos = stored.positions[layer_idx].long()  # (Hkv, M)
        present = stored_pos[0] != EMPTY  # (M,): the same for every head
        # (Hkv, M, D); an int8 document's values (re-quantizing them gives the same codes)
        stored_k, stored_v = kv_float(stored.k[layer_idx]), kv_float(stored.v[layer_idx])
        stored_k, stored_v = stored_k[:, present], stored_v[:, present]  # (Hkv, M', D)
        out = attend_with_prefix(q, k, v, stored_k, stored_v)
        dense_k, dense_v, known = self._dense(stored_k, stored_v, stored_pos[:, present], k, v)
        scores = None
        if self.window:
            q_window = q[0, :, -min(self.window, q.shape[2]):]  # (Hq, W, D)
            scores = snapkv_scores(q_window, dense_k[0], self.kernel, self.pooling, known)[None]
        kept_k, kept_v, kept_pos = compress_kv(self.layout, dense_k, dense_v, scores, self.dtype)
        self.keys.append(kept_k[0])
        self.values.append(kept_v[0])
        self.positions.append(kept_pos[0])
        return out

    def _dense(self, stored_k, stored_v, stored_pos, k, v):
        """The whole prompt's K/V (1, Hkv, P, D), zero where the store has no key, and which
        keys are known (Hkv, P) bool."""
        num_kv_heads, head_dim = k.shape[1], k.shape[3]
        doc_len, prompt_len = self.prefix.prompt_len, self.prefix.prompt_len + k.shape[2]
        dense_k = k.new_zeros(1, num_kv_heads, prompt_len, head_dim)
        dense_v = v.new_zeros(1, num_kv_heads, prompt_len, head_dim)
        index = stored_pos[None, :, :, None].expand(1, -1, -1, head_dim)  # (1, Hkv, M', D)
        dense_k.scatter_(2, index, stored_k[None].to(k.dtype))
        dense_v.scatter_(2, index, stored_v[None].to(v.dtype))
        dense_k[:, :, doc_len:] = k
        dense_v[:, :, doc_len:] = v
        known = torch.zeros(num_kv_heads, prompt_len, dtype=torch.bool, device=k.device)
        known.scatter_(1, stored_pos, True)
        known[:, doc_len:] = True
        return dense_k, dense_v, known

    def cache(self, prompt_len: int) -> SequenceCache:
        return _one_group(self.layout, torch.stack(self.keys), torch.stack(self.values),
                          torch.stack(self.positions), prompt_len)


@torch.no_grad()
def prefill_on_prefix(model: Transformer, prefix: SequenceCache, suffix_ids: list[int],
                      policy: CachePolicy, layout: CacheLayout, config: DocumentCacheConfig,
                      kv_dtype: torch.dtype, dtype: torch.dtype | None = None
                      ) -> tuple[SequenceCache, torch.Tensor]:
    """The prompt ``prefix`` (a stored document, compressed under ``config``) + ``suffix_ids``
    in ``layout`` -> its cache and the final hidden state (hidden,) of the last token; only the
    suffix runs through the model, its activations in ``dtype``."""
    if not suffix_ids:
        raise ValueError("the prompt has no tokens after the cached prefix")
    stored = prefix.groups[0].group.layout
    if stored != store_layout(layout, config):
        raise ValueError(f"the stored document's layout {stored} is not the one of "
                         f"{layout}: it was compressed for another policy")
    prompt_len = prefix.prompt_len + len(suffix_ids)
    selects = layout.compresses(prompt_len) and layout.n_topk > 0
    recorder = _SuffixRecorder(prefix, layout, kv_dtype, policy.window if selects else 0,
                               policy.kernel, policy.pooling)
    device = model.lm_head.weight.device
    ids = torch.tensor([suffix_ids], device=device)  # (1, T)
    positions = torch.arange(prefix.prompt_len, prompt_len, device=device)[None]
    hidden = model(ids, positions, recorder, dtype)
    return recorder.cache(prompt_len), hidden[0, -1]
