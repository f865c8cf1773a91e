"""PromptForward builds exactly the cache Engine.prefill builds, for any policy, observation
window and observed queries (the prompt's last, or with a probe's after them), on a Llama and on
a hybrid model (Gemma 3 layers, a sliding window shorter than the prompt)."""

import random

import pytest
import torch

from evaluation.budget import SplitRule
from evaluation.forward import PromptForward
from snapstream.config import FULL, SLIDING, RopeConfig
from snapstream.engine import Engine
from snapstream.policy import OBSERVES, POLICY_KINDS, UNITS
from snapstream.probe import probe_ids
from snapstream.units import unit_spans
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


def every_units_spans(engine, prompt) -> dict:
    return {unit: unit_spans(engine.tokenizer, prompt, unit) for unit in UNITS}


@pytest.fixture(scope="module")
def forward(engine, prompt) -> PromptForward:
    return PromptForward.run(engine.model, prompt, max_observation=64,
                             spans=every_units_spans(engine, prompt))


@pytest.fixture(scope="module")
def probed(engine, prompt) -> PromptForward:
    """The forward of the prompt and the probe a policy observing its opening reads again."""
    return PromptForward.run(engine.model, prompt, max_observation=64,
                             probe=probe_ids(engine.tokenizer, prompt, "opening"),
                             spans=every_units_spans(engine, prompt))


@pytest.mark.parametrize("kind", list(POLICY_KINDS))
# observation clamped to 20; compressed; kept whole
@pytest.mark.parametrize("budget", [24, 60, 512])
@pytest.mark.parametrize(("observation", "kernel", "pooling"), [(32, 7, "avg"), (64, 15, "max"),
                                                           (8, 1, "avg")])
@pytest.mark.parametrize("observe", OBSERVES)
@pytest.mark.parametrize("unit", UNITS)
def test_same_cache_and_logits_as_engine_prefill(engine, prompt, forward, probed, kind, budget,
                                                 observation, kernel, pooling, observe, unit):
    """Exactly, where the engine's forward is the same one: the prompt alone, or with the probe
    when the policy selects and observes its opening. A forward with the probe gives a policy
    that does not select the prompt's K/V of a forward without it, up to the rounding of
    kernels run on more rows."""
    policy = SplitRule(observation=observation, kernel=kernel, pooling=pooling,
                       observe=observe, unit=unit).policy(kind, budget)
    expected = engine.prefill(prompt, policy, STEPS, capacity=600)
    layout = policy.layout(PROMPT_LEN, STEPS, capacity=600)
    engine_probed = observe == "opening" and layout.compresses(PROMPT_LEN) and layout.n_topk > 0
    # a forward without the probe has no opening to score with
    for run in (probed,) if engine_probed else (forward, probed):
        got = run.sequence_cache(policy, STEPS, capacity=600)
        assert got.layout == expected.cache.layout
        exact = (run is probed) == engine_probed
        for part, want in zip(got.groups, expected.cache.groups, strict=True):
            assert torch.equal(part.positions, want.positions)
            for name in ("k", "v"):
                tolerance = {"rtol": 0, "atol": 0} if exact else {"rtol": 0, "atol": 1e-5}
                torch.testing.assert_close(getattr(part, name), getattr(want, name), **tolerance)
        torch.testing.assert_close(run.logits, expected.logits, rtol=0, atol=1e-5)


def test_scores_are_computed_once_per_setting(forward):
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


def test_the_probe_changes_the_scores_not_the_prompt(forward, probed):
    """The probe's queries vote (other scores than the last queries' alone), while the prompt's
    own scores and logits are those of a forward without it."""
    assert probed.probe > 0 and probed.prompt_len == forward.prompt_len == PROMPT_LEN
    torch.testing.assert_close(probed.scores(32, 7, "avg"), forward.scores(32, 7, "avg"),
                               rtol=0, atol=1e-5)
    opening = probed.scores(32, 7, "avg", "opening")[..., : PROMPT_LEN - 32]  # before the window
    assert (opening - forward.scores(32, 7, "avg")[..., : PROMPT_LEN - 32]).abs().max() > 1e-4
    torch.testing.assert_close(probed.logits, forward.logits, rtol=0, atol=1e-5)


def test_observing_the_opening_needs_a_forward_with_its_probe(forward):
    with pytest.raises(ValueError, match="probe"):
        forward.scores(32, 7, "avg", "opening")


def test_keeping_words_needs_a_forward_with_their_spans(engine, prompt):
    plain = PromptForward.run(engine.model, prompt, max_observation=64)
    with pytest.raises(ValueError, match="spans"):
        plain.scores(32, 7, "avg", "last", "word")


def test_a_word_scores_its_best_token(forward):
    words = forward.spans["word"]
    scores = forward.scores(32, 7, "avg", "last", "word")  # (L, Hkv, P)
    assert bool((words[1:] == words[:-1]).any())  # the prompt has words of several tokens
    for word in words.unique():
        at = words == word
        best = forward.scores(32, 7, "avg")[..., at].amax(dim=-1, keepdim=True)
        assert torch.equal(scores[..., at], best.expand(-1, -1, int(at.sum())))
