"""Compress once, ask many: a document's cache stored once, and prompts prefilled on it.

Store time (:func:`compress_document`): the document is prefilled once. By default
(``store="whole"``) every token is stored (:func:`store_layout`: a layout of exactly the
document, slot = position). ``store="superset"`` stores a question-agnostic subset instead,
scored without any question by a scorer of :mod:`snapstream.prefix_scores` (the worker's
``--prefix-score``): its *superset* (:func:`superset_layout`), the sinks, ``superset`` x
``n_topk`` picks by that score and the document's last ``n_recent`` tokens (a smaller blob,
fewer answers: docs/accuracy.md).

Question time (:func:`prefill_on_prefix`): only the rest of the prompt (the suffix) runs; its
queries attend to the stored keys (at their original positions, already rotated) and causally
to each other. Each layer then compresses into the request's layout exactly as a whole prompt
would be (``compress_kv``), with the stored keys and the suffix's as the only candidates and
SnapKV's observation window (the suffix's last queries, so the question's) picking the final
``n_topk``
among them. A question after a document stored whole gets the same cache as a full prefill.
A suffix shorter than the observation window (the question was inside the document's message, before
it) has no question in it: the observed queries are then those of a probe run after it, the
opening paragraph of the document's last turn and the suffix again (:func:`_probe`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from snapstream.attention import causal_attention
from snapstream.cancel import Cancel, checking
from snapstream.compress import compress_kv
from snapstream.kvcache import EMPTY, GroupKV, LayerGroup, SequenceCache
from snapstream.kvquant import kv_float
from snapstream.model import Transformer
from snapstream.policy import CacheLayout, CachePolicy
from snapstream.prefix_config import DocumentCacheConfig
from snapstream.prefix_scores import SCORERS, DocumentPass
from snapstream.snapkv import snapkv_scores
from snapstream.units import keep_whole

OPENING_TOKENS = 64  # of the opening paragraph a probe reads again (:func:`_probe`)


def superset_layout(layout: CacheLayout, config: DocumentCacheConfig) -> CacheLayout:
    """A document's superset for requests of ``layout``: its sinks, ``superset`` x its SnapKV
    picks, and the last ``n_recent`` document tokens (the ring's reach when the question is
    short)."""
    return CacheLayout(layout.n_sink, config.superset * layout.n_topk, layout.n_recent,
                       layout.n_recent)


def store_layout(layout: CacheLayout, config: DocumentCacheConfig, doc_len: int
                 ) -> CacheLayout:
    """What the stored cache of a ``doc_len``-token document holds: its superset, or under
    ``store="whole"`` every token, one slot each."""
    superset = superset_layout(layout, config)
    if config.store == "superset":
        return superset
    return CacheLayout(layout.n_sink, max(doc_len - layout.n_sink - layout.n_recent, 0),
                       layout.n_recent, layout.n_recent)


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
def compress_document(model: Transformer, doc_ids: list[int], pieces: list[str],
                      instruction_ids: list[int], layout: CacheLayout,
                      config: DocumentCacheConfig, kv_dtype: torch.dtype,
                      dtype: torch.dtype | None = None, cancel: Cancel | None = None
                      ) -> SequenceCache:
    """The document's stored cache in :func:`store_layout` of ``layout``; a superset store that
    does not hold it all is scored by ``config.score``. Slots past a short document's
    tokens stay EMPTY. ``pieces``: each document token's text; ``dtype``: the activations of
    the document's forward (the engine's prefill dtype); ``cancel``: checked before each of its
    layers."""
    check_model(model)
    stored = store_layout(layout, config, len(doc_ids))
    device = model.lm_head.weight.device
    recorder = _FullRecorder()
    hidden = model(torch.tensor([doc_ids], device=device),
                   torch.arange(len(doc_ids), device=device)[None], checking(recorder, cancel),
                   dtype)
    k, v = torch.stack(recorder.keys), torch.stack(recorder.values)  # (L, Hkv, P, D)
    if config.store == "whole" or not stored.compresses(len(doc_ids)) or stored.n_topk == 0:
        return _one_group(stored, *compress_kv(stored, k, v, None, kv_dtype), len(doc_ids))
    doc = DocumentPass(model, doc_ids, recorder.keys, recorder.values, hidden[0],
                       instruction_ids, pieces)
    scores = SCORERS[config.score](doc)  # (L, Hkv, P)
    return _one_group(stored, *compress_kv(stored, k, v, scores, kv_dtype), len(doc_ids))


def _one_group(layout: CacheLayout, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               prompt_len: int) -> SequenceCache:
    """k, v (L, Hkv, S, D), positions (L, Hkv, S) of a model without sliding layers (one layer
    group, :func:`check_model`) -> its cache of ``prompt_len`` tokens."""
    group = LayerGroup(tuple(range(k.shape[0])), layout)
    return SequenceCache((GroupKV(group, k, v, positions),), prompt_len, prompt_len)


@dataclass
class _SuffixAttention:
    """The attention of the tokens run after a stored document, forward after forward (the
    suffix, then any probe tokens): over every stored key and causally over each other.
    Keeps what the selection after the forward needs (their K/V, the last queries)."""

    keys: torch.Tensor  # (L, Hkv, M + T + A, D): the stored keys, then room for the run tokens
    values: torch.Tensor  # (L, Hkv, M + T + A, D)
    num_prefix: int  # M
    observation: int  # the last queries kept for SnapKV's scores; 0: none
    num_run: int = 0  # tokens run so far
    mask: torch.Tensor | None = None  # (t, M + num_run + t) bool of the current forward
    q_observed: list[list[torch.Tensor]] = field(default_factory=list)  # L x [(Hq, o, D)]

    def run(self, model: Transformer, ids: list[int], first_position: int,
            dtype: torch.dtype) -> torch.Tensor:
        """One forward of ``ids`` at the positions after those run so far -> (t, hidden)."""
        device = self.keys.device
        start = self.num_prefix + self.num_run
        self.mask = torch.ones(len(ids), start + len(ids), dtype=torch.bool,
                               device=device).tril(start)  # (t, M + num_run + t)
        positions = torch.arange(first_position + self.num_run,
                                 first_position + self.num_run + len(ids), device=device)
        hidden = model(torch.tensor([ids], device=device), positions[None], self, dtype)
        self.num_run += len(ids)
        return hidden[0]

    def __call__(self, layer_idx: int, q, k, v) -> torch.Tensor:
        start = self.num_prefix + self.num_run
        end = start + k.shape[2]
        self.keys[layer_idx, :, start:end] = k[0]
        self.values[layer_idx, :, start:end] = v[0]
        if self.observation:
            if layer_idx == len(self.q_observed):
                self.q_observed.append([])
            self.q_observed[layer_idx].append(q[0, :, -self.observation:])
        return F.scaled_dot_product_attention(
            q, self.keys[layer_idx, None, :, :end], self.values[layer_idx, None, :, :end],
            attn_mask=self.mask, enable_gqa=True)

    def window_queries(self) -> torch.Tensor:
        """(L, Hq, O, D): the last ``observation`` queries run, every layer."""
        return torch.stack([torch.cat(parts, dim=1)[:, -self.observation:]
                            for parts in self.q_observed])


def _suffix_attention(prefix: SequenceCache, num_tokens: int, observation: int,
                      dtype: torch.dtype
                      ) -> tuple[_SuffixAttention, torch.Tensor]:
    """The attention of up to ``num_tokens`` tokens run on ``prefix``, and the positions
    (L, Hkv, M) of the stored document's present slots (the prompt's keys before the
    suffix's)."""
    (stored,) = prefix.groups
    present = stored.positions != EMPTY  # (L, Hkv, S): the same count in every row
    num_layers, num_kv_heads, _ = present.shape
    stored_pos = stored.positions[present].view(num_layers, num_kv_heads, -1).long()
    keys, values = (_decoded_with_room(rows, present, num_tokens, dtype)
                    for rows in (stored.k, stored.v))
    return _SuffixAttention(keys, values, stored_pos.shape[2], observation), stored_pos


def _decoded_with_room(rows: torch.Tensor, present: torch.Tensor, num_tokens: int,
                       dtype: torch.dtype) -> torch.Tensor:
    """rows (L, Hkv, S, W) in the KV dtype, present (L, Hkv, S) -> (L, Hkv, M + num_tokens, D)
    in ``dtype``: the M present rows decoded, then zero rows. Decoded a layer at a time into
    one buffer (a whole document's K is ~100 MB at 8k: no float32 copy of all of it)."""
    num_layers, num_kv_heads, num_slots = present.shape
    num_prefix = int(present[0, 0].sum())
    head_dim = kv_float(rows[0, 0, :1]).shape[-1]
    out = rows.new_zeros(num_layers, num_kv_heads, num_prefix + num_tokens, head_dim,
                         dtype=dtype)
    for layer in range(num_layers):
        kept = rows[layer] if num_prefix == num_slots else rows[layer][present[layer]].view(
            num_kv_heads, num_prefix, -1)  # (Hkv, M, W)
        out[layer, :, :num_prefix] = kv_float(kept)
    return out


def _select(attention: _SuffixAttention, stored_pos: torch.Tensor, num_suffix: int,
            prompt_len: int, policy: CachePolicy, layout: CacheLayout, kv_dtype: torch.dtype,
            spans: torch.Tensor | None = None) -> SequenceCache:
    """Every layer compressed at once into ``layout`` from the stored keys (at ``stored_pos``
    (L, Hkv, M)) and the suffix's, as a whole prompt would be, without a prompt-sized copy:
    SnapKV scores the keys where they are (absent ones score -inf, never picked) and the kept
    ones are gathered from them. Every layer's heads are one batch of L x Hkv heads. ``spans``
    (P,): the prompt's spans kept whole (:func:`~snapstream.units.keep_whole`)."""
    num_layers, num_kv_heads, num_run, _ = attention.keys.shape
    run_pos = torch.arange(prompt_len - num_suffix, prompt_len - num_suffix + num_run
                           - stored_pos.shape[2], device=stored_pos.device)  # (T + A,)
    positions = torch.cat((stored_pos, run_pos.expand(num_layers, num_kv_heads, -1)),
                          dim=2)  # (L, Hkv, M + T + A): the probe's A after the prompt
    num_prompt = stored_pos.shape[2] + num_suffix  # M + T
    scores = None
    if attention.observation:  # as if the probe ended the prompt, then cut to it
        scores = snapkv_scores(attention.window_queries().flatten(0, 1),  # (L*Hq, W, D)
                               attention.keys.flatten(0, 1), policy.kernel, policy.pooling,
                               positions.flatten(0, 1))
        scores = scores.view(num_layers, num_kv_heads, -1)[..., :prompt_len]  # (L, Hkv, P)
        if spans is not None:
            scores = keep_whole(scores, spans)
    index = torch.arange(num_prompt, device=positions.device).expand(
        num_layers, num_kv_heads, -1)  # (L, Hkv, M + T)
    rows = torch.zeros(num_layers, num_kv_heads, prompt_len, dtype=torch.long,
                       device=positions.device).scatter_(2, positions[..., :num_prompt],
                                                         index)  # (L, Hkv, P): each key's row
    out_k, out_v, out_pos = compress_kv(layout, attention.keys[:, :, :num_prompt],
                                        attention.values[:, :, :num_prompt], scores, kv_dtype,
                                        rows)
    return _one_group(layout, out_k, out_v, out_pos, prompt_len)


@torch.no_grad()
def prefill_on_prefix(model: Transformer, prefix: SequenceCache, suffix_ids: list[int],
                      opening_ids: list[int], policy: CachePolicy, layout: CacheLayout,
                      config: DocumentCacheConfig, kv_dtype: torch.dtype, dtype: torch.dtype,
                      observed_probe: list[int] = (), spans: torch.Tensor | None = None
                      ) -> tuple[SequenceCache, torch.Tensor]:
    """The prompt ``prefix`` (a stored document, compressed under ``config``) + ``suffix_ids``
    in ``layout`` -> its cache and the final hidden state (hidden,) of the last token; only the
    suffix runs through the model, its activations in ``dtype``. ``opening_ids``: the opening
    paragraph of the document's last turn (``Tokenizer.turn_opening``), the probe of a suffix
    shorter than SnapKV's observation window (:func:`_probe`). ``observed_probe``: the probe
    the policy asks for (:mod:`snapstream.probe`, ``observe="opening"``), whose queries join the
    window instead, as in a whole prompt's prefill. ``spans``: (P,) the whole prompt's spans
    that SnapKV keeps whole (:mod:`snapstream.units`); None: every token alone."""
    if not suffix_ids:
        raise ValueError("the prompt has no tokens after the cached prefix")
    stored = prefix.groups[0].group.layout
    if stored != store_layout(layout, config, prefix.prompt_len):
        raise ValueError(f"the stored document's layout {stored} is not the one of "
                         f"{layout}: it was compressed for another policy")
    prompt_len = prefix.prompt_len + len(suffix_ids)
    selects = layout.compresses(prompt_len) and layout.n_topk > 0
    observation = policy.observation if selects else 0
    probe = [*opening_ids, *suffix_ids] if len(suffix_ids) < observation else []
    if selects and observed_probe:
        probe, observation = list(observed_probe), observation + len(observed_probe)
    attention, stored_pos = _suffix_attention(prefix, len(suffix_ids) + len(probe), observation,
                                              dtype)
    hidden = attention.run(model, suffix_ids, prefix.prompt_len, dtype)[-1]  # (hidden,)
    _probe(model, attention, probe, prefix.prompt_len, dtype)
    cache = _select(attention, stored_pos, len(suffix_ids), prompt_len, policy, layout,
                    kv_dtype, spans)
    return cache, hidden


def _probe(model: Transformer, attention: _SuffixAttention, probe_ids: list[int],
           first_position: int, dtype: torch.dtype) -> None:
    """Run ``probe_ids`` after the suffix through ``attention``, for their queries only: they
    are SnapKV's observed queries when the suffix is shorter than its observation window. Such
    a suffix is the
    template's opening of the answer after a document whose own message began with the
    question (its queries know nothing of it: 0-1 of 9 answers, docs/accuracy.md); the probe
    reads that opening paragraph again, then the suffix, so the observed queries are the
    question's as if it had come after the document. None of it is kept."""
    if probe_ids:
        attention.run(model, probe_ids, first_position, dtype)
