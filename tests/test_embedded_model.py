"""The shipped checkpoint: loads through the same loader as any checkpoint, serves by default,
and answers passkey prompts with the full cache and with snapstream at 1/4 budget.

The prompts are new samples (filler windows, numbers, depths) in the training wordings: on the
held-out wordings the shipped model answers about 2 prompts in 3 (docs/accuracy.md), too few for
a test that must not flake."""

from __future__ import annotations

import random

import pytest

from snapstream.config import EMBEDDED_MODEL
from snapstream.data import Placement, Split, TaskConfig, exact_match, generate
from snapstream.engine import Engine
from snapstream.evaluate.budget import Budget, SplitRule
from snapstream.evaluate.runner import stop_sampling
from snapstream.policy import CachePolicy

CONTEXT_LEN = 1024


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_pretrained()  # no path: the embedded model is the default


def test_embedded_checkpoint_is_small_gqa_and_in_hf_layout(engine):
    files = {p.name for p in EMBEDDED_MODEL.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= files
    assert sum(p.stat().st_size for p in EMBEDDED_MODEL.iterdir()) <= 20 * 2**20
    assert engine.config.num_kv_heads < engine.config.num_heads
    assert engine.context_len >= 2048
    assert engine.tokenizer.decode(engine.tokenizer.encode("Answer: 42")) == "Answer: 42"


def test_serves_with_a_pooling_kernel_that_covers_a_byte_level_needle(engine):
    # a needle of digits spans ~15 tokens of bytes (docs/accuracy.md, "pooling kernel")
    assert engine.default_policy == CachePolicy(kernel=15)


@pytest.mark.parametrize("kind", ["full", "snapstream"])
def test_answers_passkey_prompts(engine, kind):
    # snapstream at 1/4 of the context, with the model's SnapKV settings
    rule = SplitRule(kernel=engine.default_policy.kernel, pooling=engine.default_policy.pooling)
    policy = rule.policy(kind, Budget.parse("1/4").tokens_for(CONTEXT_LEN))
    for seed, depth in enumerate((0.2, 0.5, 0.8)):
        sample = generate("passkey", random.Random(f"embedded-model-test/{seed}"),
                          TaskConfig(context_len=CONTEXT_LEN, depth=depth,
                                     placement=Placement.AFTER, split=Split.TRAIN))
        out = engine.generate(sample.prompt, max_new_tokens=12, policy=policy,
                              sampling=stop_sampling(engine))
        assert exact_match(out.text, sample.answer), (depth, sample.answer, out.text)


def test_snapstream_without_eviction_generates_what_the_full_cache_does(engine):
    prompt = "The pass key is 48213. Remember it.\nWhat is the passkey?\nAnswer: "
    full = engine.generate(prompt, 8, policy=CachePolicy(kind="full"))
    roomy = engine.generate(prompt, 8, policy=CachePolicy(n_sink=4, n_topk=60, n_recent=64))
    assert full.token_ids == roomy.token_ids  # nothing evicted: identical to the full cache
