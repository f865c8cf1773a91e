"""The real Gemma 3 270M file against transformers' own GGUF reading of it, float32: logits on
a 2,048-token text and greedy tokens (slow tier: both models load, ~2 GB)."""

from __future__ import annotations

import inspect
import statistics

import pytest
import torch

from snapstream import CachePolicy, Engine, SamplingParams
from snapstream.checkpoints.registry import model_path
from tests.checkpoints.conftest import hf_gguf_model

pytestmark = pytest.mark.slow
LENGTH = 2048


@pytest.fixture(scope="module")
def models():
    path = model_path("gemma3-270m")
    return Engine.from_pretrained(str(path), dtype="float32"), hf_gguf_model(path)


@pytest.fixture(scope="module")
def text_ids(models) -> list[int]:
    return models[0].encode(inspect.getsource(statistics))[:LENGTH]


def test_logits_on_a_2k_token_text_match_transformers(models, text_ids):
    engine, reference = models
    ids = torch.tensor([text_ids])  # (1, 2048)
    with torch.no_grad():
        expected = reference(ids).logits[0]  # (P, V)
        model = engine.model
        got = model.logits(model(ids, torch.arange(LENGTH)[None], model.causal_attend)[0])
    assert (got - expected).abs().max().item() < 1e-3
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_greedy_tokens_match_transformers(models, text_ids):
    engine, reference = models
    prompt = text_ids[:600]  # past the 512-token window of the sliding layers
    with torch.no_grad():
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=16,
                                      do_sample=False, eos_token_id=None)[0, len(prompt):]
    out = engine.generate(prompt, max_new_tokens=16, policy=CachePolicy(kind="full"),
                          sampling=SamplingParams(temperature=0, ignore_eos=True))
    assert out.token_ids == expected.tolist()


def test_the_eval_forward_matches_transformers_past_the_window(models, text_ids):
    """`snapstream eval` prefills through its own recorder: on 2,048 tokens (four windows of
    the sliding layers) its last logits are transformers' (it once ran every layer global)."""
    from evaluation.forward import PromptForward

    engine, reference = models
    with torch.no_grad():
        expected = reference(torch.tensor([text_ids]), logits_to_keep=1).logits[0, -1]  # (V,)
    got = PromptForward.run(engine.model, text_ids, max_window=32).logits
    assert (got - expected).abs().max().item() < 1e-3
