"""The real Gemma 3 270M file against transformers' own GGUF reading of it, float32: logits on
a 2,048-token text and greedy tokens (slow tier: both models load, ~2 GB)."""

from __future__ import annotations

import inspect
import statistics

import pytest
import torch

from snapstream import CachePolicy, Engine
from snapstream.checkpoints.registry import model_path
from tests.checkpoints.conftest import hf_gguf_model
from tests.engine.helpers import greedy_with_logits
from tests.engine.reference import cache_kept_mask, masked_logits

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


@pytest.mark.parametrize(("length", "steps"), [(600, 16), (500, 40)],
                         ids=["prompt-past-the-window", "decode-crosses-the-window"])
def test_full_decode_matches_transformers_greedy_decode(models, text_ids, length, steps):
    """``full`` on the hybrid cache (the sliding layers: a ring of exactly 512) is
    transformers' full-cache greedy decode: the same tokens, logits within 1e-3."""
    engine, reference = models
    prompt = text_ids[:length]
    with torch.no_grad():
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=steps,
                                      do_sample=False, eos_token_id=None, output_scores=True,
                                      return_dict_in_generate=True)
    tokens, logits, _ = greedy_with_logits(engine, prompt, CachePolicy(kind="full"), steps)
    assert tokens == expected.sequences[0, length:].tolist()
    assert (logits - torch.cat(expected.scores)).abs().max().item() < 1e-3


def test_compressed_decode_matches_the_kept_set_reference(models, text_ids):
    """The default policy (SnapKV on the 3 global layers) on a 2,048-token text: each decode
    step equals full attention restricted to the kept set, windowed on the sliding layers."""
    engine = models[0]
    tokens, logits, result = greedy_with_logits(engine, text_ids, engine.default_policy, 8)
    sequence = text_ids + tokens[:-1]
    allowed = cache_kept_mask(result.cache, len(sequence), engine.config.num_kv_heads)
    reference = masked_logits(engine.model, sequence, allowed, len(text_ids))[LENGTH - 1 :]
    assert (logits - reference).abs().max().item() < 1e-3


def test_the_eval_forward_matches_transformers_past_the_window(models, text_ids):
    """`snapstream eval` prefills through its own recorder: on 2,048 tokens (four windows of
    the sliding layers) its last logits are transformers' (it once ran every layer global)."""
    from evaluation.forward import PromptForward

    engine, reference = models
    with torch.no_grad():
        expected = reference(torch.tensor([text_ids]), logits_to_keep=1).logits[0, -1]  # (V,)
    got = PromptForward.run(engine.model, text_ids, max_observation=32).logits
    assert (got - expected).abs().max().item() < 1e-3
