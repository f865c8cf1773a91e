"""Question-agnostic scores of a document's keys, for the document cache's store-time selection
(:mod:`snapstream.prefix_cache`). A registry: the prefill worker's ``--prefix-score``
(:class:`snapstream.prefix_config.DocumentCacheConfig`).

- ``surprisal`` (after Selective Context, Li et al. 2023): each token's negative log-likelihood
  under the document's own prefill (the LM head over its hidden states), then a morphological
  opening along positions: min-pooled (a token scores the least surprising of its 5-token
  neighbourhood) then max-pooled over 15 (a kept run keeps the 7 tokens on each side, the
  words that tie a number to its name). It keeps *runs* of unpredictable
  tokens (numbers, codes, names) rather than single surprising tokens in ordinary prose: a
  random number's digits each cost only ~log 10 nats, about the median prose token, so plain
  or max-pooled surprisal dropped them (docs/accuracy.md). The same score for every layer and
  head; costs one LM head over the document beyond the prefill.
- ``sentence``: the same runs of unpredictable tokens (the surprisal min-pooled over 5), each
  spread over its own sentence only: a token scores the best run up to 16 tokens after it or
  12 before it *in its sentence* (a sentence ends at ``.``, ``!``, ``?`` or a newline). A
  number then keeps the name before it and the words that tie the two, and the budget the
  ``surprisal`` opening spent on the neighbouring sentences goes to more runs
  (docs/accuracy.md).
- ``repeat`` (KVzip, Kim et al. 2025): the model is asked to repeat the document, chunk by
  chunk, over the document's whole K/V; each key scores the highest attention any repeating
  query (of its GQA group) gives it, avg-pooled. ~13x the prefill at 8k tokens (docs/accuracy.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from snapstream.model import Transformer
from snapstream.snapkv import pool_votes

RUN_KERNEL = 5  # min pooling of the surprisal: a run of 5 unpredictable tokens scores high
EDGE_KERNEL = 15  # max pooling after it: a kept run keeps 7 tokens on each side (the words
# that name a number)
LOGITS_CHUNK = 1024  # document positions per LM-head call (bounds the (chunk, V) logits)
SENTENCE_BEFORE = 16  # ``sentence``: a run reaches this many tokens back in its sentence
SENTENCE_AFTER = 12  # ... and this many on (a needle's name precedes its number)
SENTENCE_ENDS = (".", "!", "?")
REPEAT_CHUNK = 512  # document tokens repeated per forward of the repeat pass
REPEAT_KERNEL = 7  # avg pooling of the repeat scores (a kernel of 31 lost needles)
REPEAT_INSTRUCTION = "\n\nRepeat the previous context exactly.\n\n"


@dataclass(frozen=True)
class DocumentPass:
    """A document's prefill, what every scorer starts from."""

    model: Transformer
    doc_ids: list[int]
    keys: list[torch.Tensor]  # L x (Hkv, P, D), rotated
    values: list[torch.Tensor]  # L x (Hkv, P, D)
    hidden: torch.Tensor  # (P, hidden), final normed
    instruction_ids: list[int]  # REPEAT_INSTRUCTION's tokens
    pieces: list[str]  # each document token's text

    @property
    def shape(self) -> tuple[int, int, int]:
        """(L, Hkv, P) of the scores."""
        return len(self.keys), self.keys[0].shape[0], len(self.doc_ids)


@torch.no_grad()
def token_nll(doc: DocumentPass) -> torch.Tensor:
    """(P,) float32: every token's NLL given the tokens before it (the first: 0)."""
    ids = torch.tensor(doc.doc_ids, device=doc.hidden.device)  # (P,)
    nll = torch.zeros(len(doc.doc_ids), device=doc.hidden.device)  # (P,)
    for start in range(0, len(doc.doc_ids) - 1, LOGITS_CHUNK):
        end = min(start + LOGITS_CHUNK, len(doc.doc_ids) - 1)
        hidden = doc.hidden[start:end].to(doc.model.model.norm.weight.dtype)  # (C, hidden)
        log_probs = doc.model.logits(hidden).log_softmax(dim=-1)  # (C, V)
        nll[start + 1 : end + 1] = -log_probs.gather(1, ids[start + 1 : end + 1, None])[:, 0]
    return nll


def _runs(doc: DocumentPass) -> torch.Tensor:
    """(P,): the surprisal min-pooled over ``RUN_KERNEL`` (a run of unpredictable tokens)."""
    return -pool_votes(-token_nll(doc)[None], RUN_KERNEL, "max")[0]


def surprisal_scores(doc: DocumentPass) -> torch.Tensor:
    """(L, Hkv, P) float32: every token's NLL given the tokens before it, opened (min- then
    max-pooled); the first token (no context to predict it, and the attention sink) scores
    +inf."""
    opened = pool_votes(_runs(doc)[None], EDGE_KERNEL, "max")[0]  # (P,)
    opened[0] = math.inf
    return opened.expand(*doc.shape)


def sentence_ids(pieces: list[str]) -> torch.Tensor:
    """(P,) int64: each token's sentence, counted from 0; a sentence ends after a token whose
    text ends with one of ``SENTENCE_ENDS`` or holds a newline."""
    ends = [piece.rstrip().endswith(SENTENCE_ENDS) or "\n" in piece for piece in pieces]
    return torch.tensor([False, *ends[:-1]]).long().cumsum(0)


def spread_in_sentence(runs: torch.Tensor, sentences: torch.Tensor, before: int,
                       after: int) -> torch.Tensor:
    """runs, sentences (P,) -> (P,): each token's best run among the ``before`` tokens after
    it and the ``after`` tokens before it, itself included, in its own sentence."""
    num_tokens, width = runs.shape[0], before + after + 1
    padded = F.pad(runs, (after, before), value=-math.inf).unfold(0, width, 1)  # (P, W)
    owners = F.pad(sentences, (after, before), value=-1).unfold(0, width, 1)  # (P, W)
    inside = owners == sentences[:num_tokens, None]
    return padded.masked_fill(~inside, -math.inf).amax(dim=1)


def sentence_scores(doc: DocumentPass) -> torch.Tensor:
    """(L, Hkv, P) float32: the surprisal's runs spread within their sentences
    (:func:`spread_in_sentence`); the first token scores +inf."""
    sentences = sentence_ids(doc.pieces).to(doc.hidden.device)  # (P,)
    score = spread_in_sentence(_runs(doc), sentences, SENTENCE_BEFORE, SENTENCE_AFTER)
    score[0] = math.inf
    return score.expand(*doc.shape)


@torch.no_grad()
def repeat_scores(doc: DocumentPass) -> torch.Tensor:
    """(L, Hkv, P) float32: one forward per ``REPEAT_CHUNK`` of the document, at the positions
    after it, of the instruction + the chunk, over the document's K/V."""
    device, doc_len = doc.hidden.device, len(doc.doc_ids)
    scorer = _RepeatScorer(doc, 0, [torch.zeros(doc.shape[1:], device=device)
                                    for _ in doc.keys])
    for start in range(0, doc_len, REPEAT_CHUNK):
        chunk = doc.doc_ids[start : start + REPEAT_CHUNK]
        ids = torch.tensor([doc.instruction_ids + chunk], device=device)  # (1, T)
        positions = torch.arange(doc_len, doc_len + ids.shape[1], device=device)[None]
        scorer.num_scoring = len(chunk)
        doc.model(ids, positions, scorer)
    votes = torch.stack(scorer.scores)  # (L, Hkv, P)
    return pool_votes(votes.flatten(0, 1), REPEAT_KERNEL, "avg").view_as(votes)


def attend_with_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_k: torch.Tensor,
                       prefix_v: torch.Tensor) -> torch.Tensor:
    """q (1, Hq, T, D), k/v (1, Hkv, T, D) of this forward; prefix_k/v (Hkv, M, D) of earlier
    positions -> (1, Hq, T, D): every query over all the prefix keys and causally over this
    forward's."""
    num_tokens, num_prefix = q.shape[2], prefix_k.shape[1]
    keys = torch.cat((prefix_k[None].to(k.dtype), k), dim=2)  # (1, Hkv, M + T, D)
    values = torch.cat((prefix_v[None].to(v.dtype), v), dim=2)
    mask = torch.ones(num_tokens, num_prefix + num_tokens, dtype=torch.bool,
                      device=q.device).tril(num_prefix)  # (T, M + T)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)


@dataclass
class _RepeatScorer:
    """Attention of one repeat chunk over the document (+ itself); records, per layer and KV
    head, the highest attention any of the chunk's last ``num_scoring`` queries (the repeated
    text, not the instruction) gives each document key."""

    doc: DocumentPass
    num_scoring: int
    scores: list[torch.Tensor]  # L x (Hkv, P), running max over chunks

    def __call__(self, layer_idx: int, q, k, v) -> torch.Tensor:
        doc_k, doc_v = self.doc.keys[layer_idx], self.doc.values[layer_idx]  # (Hkv, P, D)
        out = attend_with_prefix(q, k, v, doc_k, doc_v)
        num_kv_heads, doc_len, head_dim = doc_k.shape
        num_tokens = q.shape[2]
        group = q.shape[1] // num_kv_heads
        q_rep = q[0, :, -self.num_scoring:].float().reshape(
            num_kv_heads, group * self.num_scoring, head_dim)  # (Hkv, G*T', D)
        keys = torch.cat((doc_k, k[0]), dim=1).float()  # (Hkv, P + T, D)
        logits = q_rep @ keys.transpose(1, 2) / math.sqrt(head_dim)  # (Hkv, G*T', P + T)
        logits = logits.view(num_kv_heads, group, self.num_scoring, doc_len + num_tokens)
        query_pos = torch.arange(num_tokens - self.num_scoring, num_tokens, device=q.device)
        future = torch.arange(num_tokens, device=q.device)[None] > query_pos[:, None]  # (T', T)
        logits[..., doc_len:] = logits[..., doc_len:].masked_fill(future, float("-inf"))
        probs = logits.softmax(dim=-1)[..., :doc_len]  # (Hkv, G, T', P)
        self.scores[layer_idx] = torch.maximum(self.scores[layer_idx], probs.amax(dim=(1, 2)))
        return out


SCORERS: dict[str, Callable[[DocumentPass], torch.Tensor]] = {
    "surprisal": surprisal_scores, "sentence": sentence_scores,
    "repeat": repeat_scores}  # keys: prefix_config.SCORES
