"""evaluation.doccache's per-question dump: the share of a needle's tokens a cache holds, and
the policy that keeps (nearly) the whole stored superset at question time."""

from __future__ import annotations

import random

import pytest
import torch

from evaluation.doccache import build_document, kept_whole
from evaluation.needles import held_share
from snapstream.kvcache import EMPTY
from snapstream.policy import CachePolicy
from snapstream.prefix_config import DocumentCacheConfig
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config

POLICY = CachePolicy(kind="snapstream", n_sink=2, n_topk=12, n_recent=8, observation=4, kernel=3)


def prompt(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (length,), generator=generator).tolist()


def test_held_share_counts_the_needle_tokens_of_every_layer_and_head():
    engine = engine_for(random_model(tiny_config(num_heads=4, num_kv_heads=2), seed=3))
    prefix = engine.compress_prefix(prompt(120, seed=4), POLICY, max_new_tokens=4,
                                    doc_config=DocumentCacheConfig(store="superset"))
    positions = prefix.groups[0].positions.long()  # (L, Hkv, S)
    held = sorted(set(positions[0, 0].tolist()))
    missing = sorted(set(range(120)) - set(positions.flatten().tolist()))
    assert held_share(prefix, held[:4]) == float(
        torch.isin(torch.tensor(held[:4]), positions).sum() / 4)
    assert held_share(prefix, [0, 1]) == 1.0  # the sinks, in every row
    assert held_share(prefix, missing[:3]) == 0.0


def test_kept_whole_reads_the_stored_cache_and_keeps_its_picks():
    engine = engine_for(random_model(tiny_config(num_heads=4, num_kv_heads=2), seed=3))
    doc_config = DocumentCacheConfig(superset=2, store="superset")
    doc, question = prompt(120, seed=4), prompt(4, seed=5)
    prefix = engine.compress_prefix(doc, POLICY, max_new_tokens=4, doc_config=doc_config)
    policy, config = kept_whole(POLICY, doc_config, len(doc))
    assert (policy.n_topk, config.superset) == (24, 1)
    result = engine.prefill_on_prefix(prefix, doc + question, policy, 4, doc_config=config)
    stored = prefix.groups[0].positions.long()[..., 2:26]  # (L, Hkv, 24): the stored picks
    final = result.cache.groups[0].positions.long()  # (L, Hkv, S)
    kept = (stored[..., None] == final[..., None, :]).any(dim=-1).sum(dim=-1)  # (L, Hkv)
    # all but those the document's last stored tokens (out of the ring now) outrank
    assert (kept >= 24 - (POLICY.n_recent - len(question))).all()
    assert (kept > POLICY.n_topk).all()  # more than the request's own selection can hold


def test_kept_whole_of_a_whole_document_keeps_every_document_token():
    engine = engine_for(random_model(tiny_config(num_heads=4, num_kv_heads=2), seed=3))
    doc, question = prompt(120, seed=4), prompt(4, seed=5)
    prefix = engine.compress_prefix(doc, POLICY, max_new_tokens=4)  # stored whole
    policy, config = kept_whole(POLICY, DocumentCacheConfig(), len(doc))
    assert policy.n_topk == 120 - 2 - 8
    result = engine.prefill_on_prefix(prefix, doc + question, policy, 4, doc_config=config)
    final = result.cache.groups[0].positions.long()  # (L, Hkv, S)
    assert (final != EMPTY).all()
    # every slot is taken: all but as many document tokens as the question pushed out
    held = (final[..., None] == torch.arange(120)).any(dim=2).sum(dim=-1)  # (L, Hkv)
    assert (held == 120 - len(question)).all()


@pytest.mark.parametrize(("task", "needles", "asked", "context_len"), [
    ("niah", 3, 3, 400), ("passkey", 3, 1, 400), ("multiquestion", 3, 5, 900)])
def test_a_document_holds_each_needle_it_asks_about(task, needles, asked, context_len):
    """Keyed tasks plant one needle per key; a passkey document holds one pass key, however
    many needles are asked for (a second would contradict it); the multi-question workload
    asks its five."""
    engine = engine_for(random_model(tiny_config(), seed=3))
    doc, asks = build_document(task, random.Random(0), engine, context_len, needles)
    assert len(asks) == asked
    assert len({ask.key for ask in asks}) == asked
    for ask in asks:
        assert doc.count(ask.fact) == 1
        assert ask.key in ask.fact and ask.answer in ask.fact
        assert ask.answer not in doc.replace(ask.fact, "")
