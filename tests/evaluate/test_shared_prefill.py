"""SharedPrefillEngine decodes exactly like Engine, running each prompt's forward once."""

import random

import pytest
import torch

from snapstream.engine import Engine
from snapstream.evaluate.budget import SplitRule
from snapstream.evaluate.shared_prefill import SharedPrefillEngine
from snapstream.policy import POLICY_KINDS
from snapstream.sampling import SamplingParams
from tests.tiny_models import random_model, tiny_config, tiny_snapstream_tokenizer

PROMPT_LEN, STEPS = 200, 6
GREEDY = SamplingParams(ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    return random_model(tiny_config(max_position_embeddings=1024))


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    rng = random.Random(0)
    return [rng.randrange(256) for _ in range(PROMPT_LEN)]


def engines(model) -> tuple[Engine, SharedPrefillEngine]:
    tokenizer = tiny_snapstream_tokenizer()
    return Engine(model, tokenizer), SharedPrefillEngine(model, tokenizer)


@pytest.mark.parametrize("kind", list(POLICY_KINDS))
@pytest.mark.parametrize("budget", [24, 60, 512])  # window clamped to 20, compressed, kept whole
def test_same_tokens_and_cache_as_engine(model, prompt, kind, budget):
    policy = SplitRule().policy(kind, budget)
    engine, shared = engines(model)
    shared.prefill(prompt, SplitRule(window=8).policy(kind, budget), STEPS)  # another forward
    expected = engine.prefill(prompt, policy, STEPS)
    got = shared.prefill(prompt, policy, STEPS)
    assert got.cache.layout == expected.cache.layout
    for name in ("k", "v", "positions"):
        assert torch.equal(getattr(got.cache, name), getattr(expected.cache, name)), name
    torch.testing.assert_close(got.logits, expected.logits, rtol=0, atol=1e-5)
    assert (shared.generate(prompt, STEPS, policy, GREEDY).token_ids
            == engine.generate(prompt, STEPS, policy, GREEDY).token_ids)


def test_one_forward_per_prompt_and_window(model, prompt, monkeypatch):
    _, shared = engines(model)
    calls = []
    run_forward = shared._run_forward
    monkeypatch.setattr(shared, "_run_forward", lambda *a: calls.append(a[1:]) or run_forward(*a))
    rule = SplitRule()
    for kind in POLICY_KINDS:
        for budget in (50, 100):
            shared.generate(prompt, STEPS, rule.policy(kind, budget), GREEDY)
    assert calls == [(32, 5, "avg")]
    shared.generate(prompt, STEPS, rule.policy("snapstream", 20), GREEDY)  # window 16
    shared.generate(prompt[1:], STEPS, rule.policy("snapstream", 50), GREEDY)  # new prompt
    assert calls == [(32, 5, "avg"), (16, 5, "avg"), (32, 5, "avg")]


@pytest.mark.parametrize("kind", ["full", "snapkv"])
def test_capacity_sizes_growing_layouts_like_engine(model, prompt, kind):
    policy, capacity = SplitRule().policy(kind, 60), PROMPT_LEN + 40
    engine, shared = engines(model)
    expected = engine.prefill(prompt, policy, STEPS, capacity=capacity)
    got = shared.prefill(prompt, policy, STEPS, capacity=capacity)
    assert got.cache.layout == expected.cache.layout
    assert torch.equal(got.cache.positions, expected.cache.positions)
