"""Compress once, ask many (snapstream/prefix_cache.py): the stored document cache and prompts
prefilled on top of it, against full prefills and brute-force restricted attention."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from snapstream.compress import compress_kv
from snapstream.kvcache import EMPTY
from snapstream.policy import CachePolicy
from snapstream.prefix_cache import OPENING_TOKENS, store_layout
from snapstream.prefix_config import SCORES, DocumentCacheConfig
from snapstream.prefix_scores import (
    EDGE_KERNEL,
    RUN_KERNEL,
    SCORERS,
    SENTENCE_AFTER,
    SENTENCE_BEFORE,
    sentence_ids,
    spread_in_sentence,
)
from tests.engine.helpers import engine_for
from tests.engine.reference import masked_logits, record_prefill, snapkv_reference_scores
from tests.tiny_models import random_model, tiny_config

POLICY = CachePolicy(kind="snapstream", n_sink=2, n_topk=12, n_recent=8, observation=4, kernel=3)
SENTENCE = DocumentCacheConfig(store="superset")
REPEAT = DocumentCacheConfig(score="repeat", store="superset")
SURPRISAL = DocumentCacheConfig(score="surprisal", store="superset")


def prompt(length: int, seed: int, vocab: int = 256) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=generator).tolist()


@pytest.fixture(scope="module")
def engine():
    return engine_for(random_model(tiny_config(num_heads=4, num_kv_heads=2), seed=3))


def test_a_document_stored_whole_gives_the_full_prefill_cache(engine):
    doc, question = prompt(30, seed=1), prompt(9, seed=2)  # 30 <= 2 + 36 + 8 stored slots
    prefix = engine.compress_prefix(doc, POLICY, max_new_tokens=4, doc_config=SENTENCE)
    stored = store_layout(POLICY.layout(30, 4), SENTENCE, 30)
    assert prefix.groups[0].group.layout == stored
    assert prefix.num_tokens_held == 30
    full = engine.prefill(doc + question, POLICY, max_new_tokens=4)
    reused = engine.prefill_on_prefix(prefix, doc + question, POLICY, max_new_tokens=4,
                                      doc_config=SENTENCE)
    # SnapKV picks among the whole prompt in both
    assert full.cache.groups[0].group.layout.compresses(39)
    assert torch.equal(reused.cache.groups[0].positions, full.cache.groups[0].positions)
    torch.testing.assert_close(reused.cache.groups[0].k, full.cache.groups[0].k, atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(reused.logits, full.logits, atol=1e-4, rtol=0)


def test_the_default_stores_the_whole_document_and_gives_the_full_prefill_cache(engine):
    """A document far longer than the request's layout is stored whole by default (a layout
    of exactly its tokens), so the question's keys and values are those of a full prefill and
    SnapKV picks among the whole prompt: the cache of a full prefill of document + question.
    (With a stored subset the question's own keys and values changed, and with them the
    answers: docs/accuracy.md.)"""
    doc, question = prompt(120, seed=5), prompt(10, seed=6)
    prefix = engine.compress_prefix(doc, POLICY, max_new_tokens=4)
    layout = prefix.groups[0].group.layout
    assert (layout.n_sink, layout.n_topk, layout.n_recent) == (2, 110, 8)
    assert (prefix.groups[0].positions.long().sort(dim=-1).values == torch.arange(120)).all()
    full = engine.prefill(doc + question, POLICY, max_new_tokens=4)
    reused = engine.prefill_on_prefix(prefix, doc + question, POLICY, max_new_tokens=4)
    assert full.cache.groups[0].group.layout.compresses(130)
    assert torch.equal(reused.cache.groups[0].positions, full.cache.groups[0].positions)
    torch.testing.assert_close(reused.cache.groups[0].k, full.cache.groups[0].k, atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(reused.cache.groups[0].v, full.cache.groups[0].v, atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(reused.logits, full.logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("doc_config", [SENTENCE, SURPRISAL, REPEAT],
                         ids=lambda c: c.score)
def test_a_long_document_keeps_a_superset_of_sinks_picks_and_its_end(engine, doc_config):
    doc = prompt(120, seed=4)
    prefix = engine.compress_prefix(doc, POLICY, max_new_tokens=4, doc_config=doc_config)
    layout = prefix.groups[0].group.layout
    num_picks = doc_config.superset * 12
    assert (layout.n_sink, layout.n_topk, layout.n_recent) == (2, num_picks, 8)
    positions = prefix.groups[0].positions.long()  # (L, Hkv, S)
    assert (positions != EMPTY).all()
    assert (positions[..., :2] == torch.arange(2)).all()
    assert (positions[..., -8:].sort(dim=-1).values == torch.arange(112, 120)).all()
    picks = positions[..., 2 : 2 + num_picks]
    assert ((picks >= 2) & (picks < 112)).all()
    assert picks.unique(dim=-1).shape[-1] == num_picks  # distinct picks per head


def test_the_superset_factor_sizes_the_stored_picks(engine):
    doc_config = replace(SENTENCE, superset=2)
    prefix = engine.compress_prefix(prompt(120, seed=4), POLICY, max_new_tokens=4,
                                    doc_config=doc_config)
    assert prefix.groups[0].group.layout.n_topk == 24
    assert prefix.groups[0].group.layout == store_layout(POLICY.layout(120, 4), doc_config,
                                                         120)


def test_the_repeat_pass_scores_each_layer_apart(engine):
    prefix = engine.compress_prefix(prompt(120, seed=4), POLICY, max_new_tokens=4,
                                    doc_config=REPEAT)
    picks = prefix.groups[0].positions.long()[..., 2:26]
    assert not torch.equal(picks[0], picks[1])


def pooled(values: list[float], kernel: int, reduce) -> list[float]:
    """``reduce`` over each ``kernel`` neighbourhood (windows cut at the ends)."""
    half = kernel // 2
    return [reduce(values[max(0, i - half) : i + half + 1]) for i in range(len(values))]


def runs(logits: torch.Tensor, ids: list[int]) -> list[float]:
    """Each token's NLL from the logits before it, the least of each RUN_KERNEL
    neighbourhood."""
    nll = [0.0] + [-logits[i - 1].log_softmax(-1)[ids[i]].item() for i in range(1, len(ids))]
    return pooled(nll, RUN_KERNEL, min)


def opened_surprisal(logits: torch.Tensor, ids: list[int], pieces: list[str]) -> list[float]:
    """The reference ``surprisal``: the runs, then the largest of each EDGE_KERNEL one."""
    return pooled(runs(logits, ids), EDGE_KERNEL, max)


def sentence_surprisal(logits: torch.Tensor, ids: list[int], pieces: list[str]) -> list[float]:
    """The reference ``sentence``: each token's best run from SENTENCE_AFTER tokens before it
    to SENTENCE_BEFORE after it, stopping at the ends of its sentence."""
    scores, sentence = runs(logits, ids), [0]
    for piece in pieces[:-1]:
        ends = piece.rstrip()[-1:] in (".", "!", "?") or "\n" in piece
        sentence.append(sentence[-1] + ends)
    return [max(scores[j] for j in range(max(0, i - SENTENCE_AFTER),
                                        min(len(ids), i + SENTENCE_BEFORE + 1))
                if sentence[j] == sentence[i]) for i in range(len(ids))]


@pytest.mark.parametrize(("doc_config", "reference"),
                         [(SURPRISAL, opened_surprisal),
                          (SENTENCE, sentence_surprisal)],
                         ids=["surprisal", "sentence"])
def test_surprisal_keeps_the_runs_of_unpredictable_tokens(engine, doc_config, reference):
    """Every layer and head stores the same picks: the candidates of the highest score
    (computed here from a full forward's logits), the first token among them."""
    full_stop = engine.tokenizer.inner.encode(".", add_special_tokens=False).ids
    doc = [token for i, token in enumerate(prompt(120, seed=9))  # a sentence every 13 tokens
           for token in ((token, *full_stop) if i % 13 == 12 else (token,))][:120]
    policy = CachePolicy(kind="snapstream", n_sink=0, n_topk=12, n_recent=8, observation=4,
                         kernel=3)
    prefix = engine.compress_prefix(doc, policy, max_new_tokens=4, doc_config=doc_config)
    positions = prefix.groups[0].positions.long()  # (L, Hkv, S)
    picks = positions[..., : doc_config.superset * 12]
    assert (picks == picks[0, 0]).all()
    causal = torch.ones(120, 120, dtype=torch.bool).tril().repeat(
        engine.config.num_layers, engine.config.num_kv_heads, 1, 1)
    pieces = [engine.tokenizer.decode([token]) for token in doc]
    score = reference(masked_logits(engine.model, doc, causal), doc, pieces)
    kept = set(picks[0, 0].tolist())
    assert 0 in kept
    others = [score[i] for i in range(1, 112) if i not in kept]
    assert min(score[i] for i in kept - {0}) >= max(others) - 1e-4


def test_a_sentence_ends_after_a_full_stop_or_a_newline():
    pieces = ["A", " b", ".", " C", " d", "?\n", "e", "\n", " f", "!", " g"]
    assert sentence_ids(pieces).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4]


def test_a_run_spreads_over_its_own_sentence_only():
    """A run at 10 reaches 2 tokens back and 1 on, but not past its sentence's end at 10."""
    scores = torch.zeros(16)
    scores[10] = 5.0
    sentences = torch.tensor([0] * 11 + [1] * 5)  # (16,)
    spread = spread_in_sentence(scores, sentences, before=2, after=1)
    assert spread.tolist() == [0.0] * 8 + [5.0, 5.0, 5.0] + [0.0] * 5
    assert (SENTENCE_BEFORE, SENTENCE_AFTER) == (16, 12)


def test_the_suffix_attends_to_exactly_the_stored_keys(engine):
    """The question's logits equal a full forward in which the question may see only the
    document's stored positions (per layer and KV head) and itself, causally."""
    doc, question = prompt(120, seed=5), prompt(10, seed=6)
    prefix = engine.compress_prefix(doc, POLICY, max_new_tokens=4, doc_config=SENTENCE)
    ids = doc + question
    reused = engine.prefill_on_prefix(prefix, ids, POLICY, max_new_tokens=4, doc_config=SENTENCE)
    config = engine.config
    total = len(ids)
    allowed = torch.ones(total, total, dtype=torch.bool).tril().repeat(
        config.num_layers, config.num_kv_heads, 1, 1)  # (L, Hkv, T, T)
    for layer in range(config.num_layers):
        for head in range(config.num_kv_heads):
            seen = torch.zeros(total, dtype=torch.bool)
            seen[prefix.groups[0].positions[layer, head].long()] = True
            seen[len(doc):] = True
            allowed[layer, head, len(doc):] &= seen
    reference = masked_logits(engine.model, ids, allowed)[-1]
    torch.testing.assert_close(reused.logits, reference, atol=1e-4, rtol=0)


def test_the_final_cache_picks_among_stored_and_question_tokens(engine):
    doc, question = prompt(120, seed=7), prompt(10, seed=8)
    prefix = engine.compress_prefix(doc, POLICY, max_new_tokens=4, doc_config=SENTENCE)
    reused = engine.prefill_on_prefix(prefix, doc + question, POLICY, max_new_tokens=4,
                                      doc_config=SENTENCE)
    cache = reused.cache
    assert cache.layout == engine.model_layout(POLICY.layout(130, 4))
    positions = cache.groups[0].positions.long()
    ring = positions[..., POLICY.n_sink + POLICY.n_topk:]
    assert (ring.sort(dim=-1).values == torch.arange(122, 130)).all()
    picks = positions[..., POLICY.n_sink : POLICY.n_sink + POLICY.n_topk]
    for layer in range(engine.config.num_layers):
        for head in range(engine.config.num_kv_heads):
            stored = set(prefix.groups[0].positions[layer, head].tolist())
            assert set(picks[layer, head].tolist()) <= stored | set(range(120, 122))


def test_a_suffix_shorter_than_the_window_is_scored_by_the_turns_opening_read_again(engine):
    """A 2-token suffix cannot fill the 4-query observation window (the question was asked
    before the
    document, in its message): the opening paragraph of that message (the question) and the
    suffix are run again after the prompt, and their last queries score it, as SnapKV scores
    a prompt that they end. None of them is kept."""
    tokenizer = engine.tokenizer
    head = tokenizer.encode("<|im_start|>user\nwhich key?\n\n")
    generator = torch.Generator().manual_seed(1)
    doc = head + torch.randint(3, 200, (30,), generator=generator).tolist()  # stored whole
    suffix = prompt(2, seed=11)
    ids = doc + suffix
    opening = tokenizer.turn_opening(doc, OPENING_TOKENS)
    assert tokenizer.decode(opening) == "which key?\n"
    prefix = engine.compress_prefix(doc, POLICY, max_new_tokens=4)
    reused = engine.prefill_on_prefix(prefix, ids, POLICY, max_new_tokens=4)
    queries, keys = record_prefill(engine.model, ids + opening + suffix)
    observation, num_prompt = POLICY.observation, len(ids)
    scores = torch.stack([snapkv_reference_scores(q[:, -observation:], k, POLICY.kernel,
                                                  POLICY.pooling)[:, :num_prompt]
                          for q, k in zip(queries, keys, strict=True)])  # (L, Hkv, P)
    prompt_keys = torch.stack(keys)[:, :, :num_prompt]  # (L, Hkv, P, D)
    _, _, expected = compress_kv(POLICY.layout(num_prompt, 4), prompt_keys, prompt_keys,
                                 scores.float())
    assert torch.equal(reused.cache.groups[0].positions, expected)
    # not the selection of the suffix's own queries (the full prefill's, observation 2)
    own = engine.prefill(ids, replace(POLICY, observation=2), max_new_tokens=4)
    assert not torch.equal(own.cache.groups[0].positions, expected)
    full = engine.prefill(ids, CachePolicy(kind="full"), max_new_tokens=4)
    torch.testing.assert_close(reused.logits, full.logits, atol=1e-4, rtol=0)


def test_refuses_what_it_cannot_serve(engine):
    with pytest.raises(ValueError, match="cache_prefix needs a policy"):
        engine.compress_prefix(prompt(40, 1), CachePolicy(kind="full"), max_new_tokens=4)
    prefix = engine.compress_prefix(prompt(40, 1), POLICY, max_new_tokens=4,
                                    doc_config=SENTENCE)
    with pytest.raises(ValueError, match="no tokens after the cached prefix"):
        engine.prefill_on_prefix(prefix, prompt(40, 1), POLICY, max_new_tokens=4,
                                 doc_config=SENTENCE)
    with pytest.raises(ValueError, match="compressed for another policy"):
        engine.prefill_on_prefix(prefix, prompt(50, 1), replace(POLICY, n_topk=20),
                                 max_new_tokens=4, doc_config=SENTENCE)
    for other in (replace(SENTENCE, superset=2), DocumentCacheConfig()):
        with pytest.raises(ValueError, match="compressed for another policy"):
            engine.prefill_on_prefix(prefix, prompt(50, 1), POLICY, max_new_tokens=4,
                                     doc_config=other)
    whole = engine.compress_prefix(prompt(40, 1), POLICY, max_new_tokens=4)
    with pytest.raises(ValueError, match="compressed for another policy"):
        engine.prefill_on_prefix(whole, prompt(50, 1), replace(POLICY, n_recent=6),
                                 max_new_tokens=4)
    with pytest.raises(ValueError, match="--prefix-score must be one of"):
        DocumentCacheConfig(score="h2o")
    with pytest.raises(ValueError, match="--prefix-superset must be >= 1"):
        DocumentCacheConfig(superset=0)
    with pytest.raises(ValueError, match="--prefix-store must be one of"):
        DocumentCacheConfig(store="half")


def test_every_configurable_score_has_a_scorer():
    assert set(SCORES) == set(SCORERS)


def test_an_int8_document_is_read_back_for_the_question():
    engine = engine_for(random_model(tiny_config(num_heads=4, num_kv_heads=2), seed=3),
                        kv_dtype=torch.int8)
    doc, question = prompt(30, seed=1), prompt(9, seed=2)  # stored whole
    prefix = engine.compress_prefix(doc, POLICY, max_new_tokens=4)
    assert prefix.groups[0].k.dtype == torch.int8
    full = engine.prefill(doc + question, POLICY, max_new_tokens=4)
    reused = engine.prefill_on_prefix(prefix, doc + question, POLICY, max_new_tokens=4)
    assert reused.cache.groups[0].k.dtype == torch.int8
    # the question attends to the document's int8-rounded keys, the full prefill to exact ones
    torch.testing.assert_close(reused.logits, full.logits, atol=0.05, rtol=0)
