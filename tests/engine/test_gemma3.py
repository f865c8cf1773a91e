"""Gemma 3 in the engine, against transformers' Gemma3ForCausalLM on the same random weights:
sliding-window layers (a window shorter than the prompt), their own RoPE base, norms around
attention and MLP and on queries and keys, GELU-tanh, scaled embeddings, a query scale of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snapstream import CachePolicy, Engine, SamplingParams
from snapstream.attention import causal_attention
from snapstream.config import FULL, SLIDING, ModelConfig
from snapstream.cpu import matmul_dtype_name
from tests.engine.helpers import greedy_with_logits
from tests.engine.reference import cache_kept_mask, masked_logits
from tests.tiny_models import TINY_VOCAB_SIZE, write_tokenizer_files

WINDOW = 8
PROMPT = 40  # five windows


def _hf_config(**overrides):
    import transformers

    fields = dict(vocab_size=TINY_VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                  sliding_window=WINDOW, max_position_embeddings=512, query_pre_attn_scalar=24,
                  rope_parameters={FULL: {"rope_type": "default", "rope_theta": 1e6},
                                   SLIDING: {"rope_type": "default", "rope_theta": 1e4}},
                  bos_token_id=None, eos_token_id=263, pad_token_id=0)
    return transformers.Gemma3TextConfig(**{**fields, **overrides})


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    import transformers

    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(_hf_config()).eval()
    with torch.no_grad():
        for param in model.parameters():  # norms away from 1 + 0, so a missed shift shows
            param.normal_(0.0, 0.1 if param.dim() > 1 else 0.3)
    directory = tmp_path_factory.mktemp("gemma3")
    model.save_pretrained(directory)
    write_tokenizer_files(directory)
    return directory, model


@pytest.fixture(scope="module")
def engine(gemma) -> Engine:
    return Engine.from_pretrained(str(gemma[0]), dtype="float32")


def _ids(seed: int, length: int = PROMPT) -> torch.Tensor:
    return torch.randint(5, 250, (1, length), generator=torch.Generator().manual_seed(seed))


def test_config_reads_the_layer_pattern_and_both_rope_bases(engine):
    config = engine.config
    assert config.model_type == "gemma3" and config.hidden_act == "gelu_tanh"
    assert config.sliding_layers == (0, 1, 2, 3, 4)
    assert config.attention_windows == (WINDOW,) * 5 + (None,)
    assert (config.rope.theta, config.local_rope.theta) == (1e6, 1e4)
    assert config.query_scale == pytest.approx(24**-0.5)
    assert config.embed_scale == pytest.approx(64**0.5)
    assert ModelConfig.from_dict(config.to_hf_dict()) == config
    # an int, as in Gemma 3's own configs (transformers >= 5.5 refuses a float here)
    assert type(config.to_hf_dict()["query_pre_attn_scalar"]) is int


@pytest.mark.parametrize("seed", range(3))
def test_prefill_logits_match_transformers(gemma, engine, seed):
    ids = _ids(seed)
    with torch.no_grad():
        expected = gemma[1](ids).logits[0]  # (P, V)
        model = engine.model
        got = model.logits(model(ids, torch.arange(PROMPT)[None], model.causal_attend)[0])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("seed", "length"), [(0, PROMPT), (1, PROMPT), (2, 3), (3, WINDOW)])
def test_full_decode_matches_transformers_full_cache_decode(gemma, engine, seed, length):
    """``full`` on the hybrid cache (sliding layers: a ring of exactly the window) equals
    transformers' own greedy decode, token for token and logits within 1e-4, for prompts
    inside and past the window and generations that cross it several times."""
    ids = _ids(seed, length)
    steps = 3 * WINDOW + 2
    with torch.no_grad():
        expected = gemma[1].generate(ids, max_new_tokens=steps, do_sample=False,
                                     eos_token_id=None, output_scores=True,
                                     return_dict_in_generate=True)
    tokens, logits, result = greedy_with_logits(engine, ids[0].tolist(),
                                                CachePolicy(kind="full"), steps)
    assert result.cache.groups[1].group.layout.budget == WINDOW
    assert tokens == expected.sequences[0, length:].tolist()
    torch.testing.assert_close(logits, torch.cat(expected.scores), atol=1e-4, rtol=0)


@pytest.mark.parametrize("length", [3, PROMPT, 90])
def test_compressing_decode_matches_the_kept_set_reference(engine, length):
    """SnapKV on the global layer and the window ring on the sliding ones, past both budgets:
    every decode step equals full attention restricted to what the cache keeps."""
    ids = _ids(length, length)[0].tolist()
    policy = CachePolicy(kind="snapstream", n_sink=2, n_topk=8, n_recent=6, observation=4, kernel=3)
    tokens, logits, result = greedy_with_logits(engine, ids, policy, 2 * WINDOW + 1)
    sequence = ids + tokens[:-1]
    allowed = cache_kept_mask(result.cache, len(sequence), engine.config.num_kv_heads)
    reference = masked_logits(engine.model, sequence, allowed, len(ids))[len(ids) - 1 :]
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=0)


def test_a_fixed_cache_holding_every_token_decodes_as_full_attention(engine):
    ids = _ids(7)[0].tolist()
    sampling = SamplingParams(temperature=0, ignore_eos=True)
    full = engine.generate(ids, max_new_tokens=10, policy=CachePolicy(kind="full"),
                           sampling=sampling)
    roomy = CachePolicy(kind="snapstream", n_sink=0, n_topk=16, n_recent=64, observation=4,
                        kernel=3)
    assert engine.generate(ids, max_new_tokens=10, policy=roomy, sampling=sampling).token_ids \
        == full.token_ids


@pytest.mark.parametrize("length", [1, 7, 8, 9, 23])
def test_windowed_attention_equals_a_masked_reference(length):
    torch.manual_seed(length)
    q, k, v = torch.randn(1, 4, length, 16), torch.randn(1, 2, length, 16), \
        torch.randn(1, 2, length, 16)
    pos = torch.arange(length)
    mask = (pos[None] <= pos[:, None]) & (pos[None] > pos[:, None] - WINDOW)  # (T, T)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(causal_attention(q, k, v, WINDOW), expected)


def test_a_quantized_gemma_prompt_runs_in_bfloat16_close_to_float32(gemma):
    """int8 weights run the prompt in bfloat16 where the CPU multiplies it (sliding and global
    layers, scaled embeddings, norms in the activations' dtype); the same weights with a float32
    prompt give nearly the same logits and the same cache layout."""
    quantized = Engine.from_pretrained(str(gemma[0]), dtype="int8")
    assert quantized.prefill_dtype == getattr(torch, matmul_dtype_name())
    served, fp32 = (Engine(quantized.model, quantized.tokenizer, kv_dtype=quantized.kv_dtype,
                           prefill_dtype=prompt_dtype)
                    for prompt_dtype in (torch.bfloat16, torch.float32))
    ids = _ids(11, 150)[0].tolist()  # many windows, past the bfloat16 GEMM's row threshold
    policy = CachePolicy(kind="snapstream", n_sink=2, n_topk=16, n_recent=16, observation=4,
                         kernel=3)
    got, want = served.prefill(ids, policy, 4), fp32.prefill(ids, policy, 4)
    assert float((got.logits - want.logits).norm() / want.logits.norm()) < 0.03
    for part, reference in zip(got.cache.groups, want.cache.groups, strict=True):
        assert part.k.shape == reference.k.shape and part.k.dtype == served.kv_dtype == torch.int8
    sliding = got.cache.groups[1]  # the window ring: the same last tokens whatever the dtype
    assert torch.equal(sliding.positions, want.cache.groups[1].positions)
