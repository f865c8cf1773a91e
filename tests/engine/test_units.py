"""What SnapKV keeps whole (snapstream.units): words of a prompt's token texts, each word's
tokens scoring its best, so that prefill keeps a word whole or not at all."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from snapstream.compress import compress_kv
from snapstream.policy import CachePolicy
from snapstream.units import WORD_TOKENS, keep_whole, unit_spans, word_ids
from tests.engine.helpers import engine_for
from tests.engine.reference import record_prefill, snapkv_reference_scores
from tests.tiny_models import random_model, tiny_config

POLICY = CachePolicy(kind="snapstream", n_sink=2, n_topk=12, n_recent=8, observation=4, kernel=3,
                     unit="word")


def test_a_number_its_key_and_an_identifier_are_words():
    # Qwen2.5's pieces of "for brave-tiger is: 6164416.\n   def foo_bar(x):\n\treturn x"
    pieces = [" for", " brave", "-t", "iger", " is", ":", " ", "6", "1", "6", "4", "4", "1",
              "6", ".\n", "   ", " def", " foo", "_bar", "(x", "):\n", "\treturn", " x"]
    words = word_ids(pieces).tolist()
    text = {}
    for piece, word in zip(pieces, words, strict=True):
        text[word] = text.get(word, "") + piece
    assert list(text.values()) == [" for", " brave-tiger", " is:", " ", "6164416.\n", "   ",
                                   " def", " foo_bar(x):\n", "\treturn", " x"]
    assert words == sorted(words)


def test_special_tokens_and_what_follows_whitespace_start_words():
    pieces = ["", "user", "\n", "Read", "", "x(", "\n", "y"]
    assert word_ids(pieces).tolist() == [0, 1, 2, 3, 4, 5, 6, 7]


def test_a_long_run_is_cut_into_words_of_the_longest_length():
    words = word_ids([" a"] + ["b"] * (2 * WORD_TOKENS)).tolist()
    assert words == [0] * WORD_TOKENS + [1] * WORD_TOKENS + [2]


def test_each_position_scores_its_spans_best_and_absent_keys_stay_absent():
    scores = torch.tensor([[1.0, 5.0, 2.0, -math.inf, 3.0, 0.5],
                           [4.0, 1.0, 1.0, 2.0, -math.inf, 9.0]])  # (2, P)
    spans = torch.tensor([0, 0, 1, 1, 1, 2])
    got = keep_whole(scores, spans)
    want = torch.tensor([[5.0, 5.0, 3.0, -math.inf, 3.0, 0.5],
                         [4.0, 4.0, 2.0, 2.0, -math.inf, 9.0]])
    assert torch.equal(got, want)


def expected_positions(engine, ids: list[int], policy: CachePolicy) -> torch.Tensor:
    """(L, Hkv, S): the reference SnapKV selection over a plain forward, each word scoring its
    best."""
    queries, keys = record_prefill(engine.model, ids)
    spans = unit_spans(engine.tokenizer, ids, policy.unit)
    scores = torch.stack([snapkv_reference_scores(q[:, -policy.observation:], k, policy.kernel,
                                                  policy.pooling)
                          for q, k in zip(queries, keys, strict=True)]).float()  # (L, Hkv, P)
    prompt_keys = torch.stack(keys)  # (L, Hkv, P, D)
    return compress_kv(policy.layout(len(ids), 4), prompt_keys, prompt_keys,
                       keep_whole(scores, spans))[2]


@pytest.fixture(scope="module")
def engine():
    return engine_for(random_model(tiny_config(num_heads=4, num_kv_heads=2), seed=3))


@pytest.fixture(scope="module")
def ids(engine) -> list[int]:
    return engine.tokenizer.encode("<|im_start|>user\n" + " ".join(
        f"key{i} is 12{i}45{i}7 and name_{i}.x" for i in range(8)) + "<|im_end|>\n")


def test_prefill_keeps_the_reference_selection_of_whole_words(engine, ids):
    result = engine.prefill(ids, POLICY, max_new_tokens=4)
    positions = result.cache.groups[0].positions  # (L, Hkv, S)
    assert torch.equal(positions, expected_positions(engine, ids, POLICY))
    tokens = engine.prefill(ids, replace(POLICY, unit="token"), max_new_tokens=4)
    assert not torch.equal(positions, tokens.cache.groups[0].positions)
    assert torch.equal(result.logits, tokens.logits)


def test_selected_words_are_whole_but_at_the_budgets_edge(engine, ids):
    """Of the words prefill selects from, at most one per layer and head is cut: the one whose
    tied scores straddle the last selected slot."""
    spans = unit_spans(engine.tokenizer, ids, "word")
    layout = POLICY.layout(len(ids), 4)
    candidates = range(layout.n_sink, len(ids) - layout.n_recent)
    positions = engine.prefill(ids, POLICY, max_new_tokens=4).cache.groups[0].positions
    for picked in positions.flatten(0, 1)[:, layout.n_sink : layout.ring_start]:  # (K,) a head
        chosen = {int(spans[p]) for p in picked}
        cut = [word for word in chosen
               if {p for p in candidates if spans[p] == word} - set(picked.tolist())]
        assert len(cut) <= 1


def test_the_document_cache_keeps_whole_words(engine, ids):
    doc_len = len(ids) - 6
    prefix = engine.compress_prefix(ids[:doc_len], POLICY, max_new_tokens=4)
    reused = engine.prefill_on_prefix(prefix, ids, POLICY, max_new_tokens=4)
    tokens = engine.prefill_on_prefix(prefix, ids, replace(POLICY, unit="token"),
                                      max_new_tokens=4)
    assert not torch.equal(reused.cache.groups[0].positions, tokens.cache.groups[0].positions)
