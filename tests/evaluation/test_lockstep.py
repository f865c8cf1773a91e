"""Decoding prompts together under one layout gives each the tokens Engine.generate gives it
alone; forced tokens go through the cache first; scoring stops a row."""

import random

import pytest
import torch

from evaluation.budget import SplitRule
from evaluation.forward import PromptForward
from evaluation.lockstep import RowInput, decode_rows
from snapstream.engine import Engine
from snapstream.sampling_params import SamplingParams
from tests.tiny_models import random_model, tiny_config, tiny_snapstream_tokenizer

STEPS = 8


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(random_model(tiny_config(max_position_embeddings=1024)),
                  tiny_snapstream_tokenizer())


def prompts() -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(256) for _ in range(length)] for length in (150, 180, 210)]


def rows(engine, kind: str, forced: tuple[int, ...] = (), answers=()) -> list[RowInput]:
    policy = SplitRule().policy(kind, 64)
    capacity = 210 + len(forced) + STEPS
    out = []
    for ids in prompts():
        forward = PromptForward.run(engine.model, ids, max_observation=32)
        out.append(RowInput(forward.sequence_cache(policy, len(forced) + STEPS, capacity),
                            forward.logits, forced, answers, STEPS))
    return out


@pytest.mark.parametrize("kind", ["full", "streaming", "snapkv", "snapstream"])
@pytest.mark.parametrize("forced", [(), (5, 6, 7, 8, 9, 10, 11, 12)])
def test_rows_match_engine_generate_alone(engine, kind, forced):
    outputs = decode_rows(engine, rows(engine, kind, forced))
    policy = SplitRule().policy(kind, 64)
    for ids, out in zip(prompts(), outputs, strict=True):
        alone = engine.generate(ids, STEPS, policy, SamplingParams(), forced_ids=forced)
        expected = alone.token_ids[:-1] if alone.finish_reason == "stop_token" else alone.token_ids
        assert out.token_ids == expected
        assert out.text == engine.tokenizer.decode(expected)
        assert out.finish_reason == {"stop_token": "stop_token", "length": "length"}[
            alone.finish_reason]
        assert out.correct is None  # no answers: not scored


def test_scored_rows_stop_at_their_verdict(engine):
    outputs = decode_rows(engine, rows(engine, "snapstream", answers=("31337",)))
    for out in outputs:
        assert out.correct is False  # a random model does not write the answer
        assert out.finish_reason in ("verdict", "length", "stop_token")
        assert len(out.token_ids) <= STEPS


def test_forced_nll_is_the_full_caches_teacher_forced_loss(engine):
    forced = (5, 6, 7, 8, 9, 10, 11, 12)
    outputs = decode_rows(engine, rows(engine, "full", forced))
    for ids, out in zip(prompts(), outputs, strict=True):
        sequence = torch.tensor([ids + list(forced)])  # (1, P + F)
        positions = torch.arange(sequence.shape[1])[None]  # (1, P + F)
        with torch.no_grad():
            model = engine.model
            hidden = model(sequence, positions, model.causal_attend)  # (1, P + F, hidden)
            logits = engine.model.logits(hidden[0, len(ids) - 1 : -1]).float()  # (F, V)
        expected = torch.nn.functional.cross_entropy(logits, torch.tensor(forced)).item()
        assert out.mean_forced_nll(len(forced)) == pytest.approx(expected, rel=1e-3)


def test_a_policy_that_evicts_the_forced_text_predicts_it_differently(engine):
    forced = tuple(range(40, 120))  # longer than the 16-token ring of 64 slots
    full, compressed = (decode_rows(engine, rows(engine, kind, forced))[0]
                        for kind in ("full", "streaming"))
    assert full.forced_nll > 0 and compressed.forced_nll > 0
    assert full.forced_nll != pytest.approx(compressed.forced_nll, rel=1e-4)
