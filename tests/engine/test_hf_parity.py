"""Parity with transformers on random LlamaForCausalLM / Qwen2ForCausalLM checkpoints."""

from __future__ import annotations

import pytest
import torch

from snapstream.checkpoints import open_checkpoint
from snapstream.engine import Engine
from snapstream.loader import load_model
from snapstream.policy import CachePolicy
from snapstream.sampling_params import SamplingParams


@pytest.fixture(params=["llama_dir", "qwen2_dir"])
def checkpoint(request):
    return request.getfixturevalue(request.param)


def _hf_model(path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_logits_match_transformers(checkpoint):
    ours, theirs = load_model(open_checkpoint(checkpoint)), _hf_model(checkpoint)
    ids = torch.randint(0, 256, (1, 700), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = theirs(ids).logits[0]
        got = ours.logits(ours(ids, torch.arange(700)[None], ours.causal_attend))[0]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_greedy_tokens_match_transformers(checkpoint):
    engine = Engine.from_pretrained(checkpoint)
    ids = list(range(40, 90))
    expected = _hf_model(checkpoint).generate(
        torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False)[0, 50:]
    got = engine.generate(ids, max_new_tokens=32, policy=CachePolicy(kind="full"),
                          sampling=SamplingParams(ignore_eos=True))
    assert got.token_ids == expected.tolist()


def test_config_reads_rope_and_bias(llama_dir, qwen2_dir):
    llama, qwen = open_checkpoint(llama_dir).config, open_checkpoint(qwen2_dir).config
    assert llama.rope.rope_type == "llama3" and llama.rope.factor == 8.0
    assert not llama.qkv_bias and qwen.qkv_bias and not qwen.o_bias
    assert qwen.tie_word_embeddings


def test_bfloat16_runs_and_tracks_float32(llama_dir):
    ids = list(range(60))
    fp32 = Engine.from_pretrained(llama_dir, dtype="float32")
    bf16 = Engine.from_pretrained(llama_dir, dtype="bfloat16")
    assert bf16.model.lm_head.weight.dtype == torch.bfloat16
    assert bf16.model.rotary.inv_freq.dtype == torch.float32
    a = fp32.prefill(ids, CachePolicy(kind="full"), 1).logits
    b = bf16.prefill(ids, CachePolicy(kind="full"), 1).logits
    assert torch.isfinite(b).all()
    assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.99


def test_sharded_checkpoint_loads_like_single_file(llama_dir, tmp_path):
    import transformers

    model = _hf_model(llama_dir)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    a, b = load_model(open_checkpoint(llama_dir)), load_model(open_checkpoint(tmp_path))
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert transformers  # imported for save_pretrained above


def test_mismatched_checkpoint_is_rejected(llama_dir, tmp_path):
    import json
    import shutil

    shutil.copytree(llama_dir, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing"):
        load_model(open_checkpoint(tmp_path))
