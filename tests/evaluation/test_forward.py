"""PromptForward builds exactly the cache Engine.prefill builds, for any policy and observation
window, on a
Llama and on a hybrid model (Gemma 3 layers, a sliding window shorter than the prompt)."""

import random

import pytest
import torch

from evaluation.budget import SplitRule
from evaluation.forward import PromptForward
from snapstream.config import FULL, SLIDING, RopeConfig
from snapstream.engine import Engine
from snapstream.policy import POLICY_KINDS
from tests.tiny_models import random_model, tiny_config, tiny_snapstream_tokenizer

PROMPT_LEN, STEPS, SLIDING_WINDOW = 200, 6, 48
HYBRID = dict(model_type="gemma3", hidden_act="gelu_tanh", layer_types=(SLIDING, FULL),
              sliding_window=SLIDING_WINDOW, local_rope=RopeConfig(theta=100.0))


@pytest.fixture(scope="module", params=["llama", "hybrid"])
def engine(request) -> Engine:
    family = HYBRID if request.param == "hybrid" else {}
    return Engine(random_model(tiny_config(max_position_embeddings=1024, **family)),
                  tiny_snapstream_tokenizer())


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    rng = random.Random(0)
    return [rng.randrange(256) for _ in range(PROMPT_LEN)]


@pytest.fixture(scope="module")
def forward(engine, prompt) -> PromptForward:
    return PromptForward.run(engine.model, prompt, max_observation=64)


@pytest.mark.parametrize("kind", list(POLICY_KINDS))
# observation clamped to 20; compressed; kept whole
@pytest.mark.parametrize("budget", [24, 60, 512])
@pytest.mark.parametrize(("observation", "kernel", "pooling"), [(32, 7, "avg"), (64, 15, "max"),
                                                           (8, 1, "avg")])
def test_same_cache_and_logits_as_engine_prefill(engine, prompt, forward, kind, budget, observation,
                                                 kernel, pooling):
    policy = SplitRule(observation=observation, kernel=kernel, pooling=pooling).policy(kind, budget)
    expected = engine.prefill(prompt, policy, STEPS, capacity=600)
    got = forward.sequence_cache(policy, STEPS, capacity=600)
    assert got.layout == expected.cache.layout
    for part, want in zip(got.groups, expected.cache.groups, strict=True):
        for name in ("k", "v", "positions"):
            assert torch.equal(getattr(part, name), getattr(want, name)), name
    torch.testing.assert_close(forward.logits, expected.logits, rtol=0, atol=1e-5)


def test_scores_are_computed_once_per_triple(forward):
    first = forward.scores(32, 7, "avg")
    assert forward.scores(32, 7, "avg") is first
    assert first.shape == (2, 2, PROMPT_LEN)  # (L, Hkv, P)
    assert not torch.equal(forward.scores(16, 7, "avg"), first)


def test_a_window_beyond_the_kept_queries_is_refused(forward):
    with pytest.raises(ValueError, match="max_observation"):
        forward.scores(65, 7, "avg")


def test_a_sliding_layer_attends_within_its_window(prompt):
    """The forward's logits are the model's own causal forward's (windowed), not those of full
    attention on every layer: the sliding layer sees only its last SLIDING_WINDOW keys."""
    model = random_model(tiny_config(max_position_embeddings=1024, **HYBRID))
    ids = torch.tensor([prompt])  # (1, P)
    with torch.no_grad():
        hidden = model(ids, torch.arange(PROMPT_LEN)[None], model.causal_attend)  # (1, P, h)
        expected = model.logits(hidden[0, -1])  # (V,)
    got = PromptForward.run(model, prompt, max_observation=64).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
