"""Small GGUF files written with gguf's writer: every architecture and tensor type we read,
checked against transformers' GGUF loader and against the same weights as a HF directory."""

from __future__ import annotations

from dataclasses import replace

import gguf
import pytest
import torch
from torch import nn

from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.gguf_weights import unpermute_rows
from snapstream.engine import Engine
from snapstream.loader import load_model
from snapstream.quant import Int4Linear, Int8Linear, QuantizedEmbedding
from tests.checkpoints.conftest import hf_gguf_model, hf_gguf_tokenizer
from tests.tiny_models import (
    CHATML,
    EOS_ID,
    llama_cpp_permute,
    random_model,
    tiny_config,
    write_gguf,
    write_hf_dir,
)

T = gguf.GGMLQuantizationType
IDS = torch.tensor([[5, 70, 100, 200, 3, 9, 44, 120, 7]])  # (1, 9)
LEGACY_QUANTS = {"token_embd.weight": T.Q8_0, "attn_q.weight": T.Q8_0, "attn_k.weight": T.Q4_0,
                 "attn_v.weight": T.Q4_1, "attn_output.weight": T.Q5_0,
                 "ffn_gate.weight": T.Q5_1, "ffn_up.weight": T.F16, "ffn_down.weight": T.BF16}
K_QUANTS = {"attn_q.weight": T.Q2_K, "attn_k.weight": T.Q3_K, "attn_v.weight": T.Q4_K,
            "attn_output.weight": T.Q5_K, "ffn_gate.weight": T.Q6_K, "ffn_up.weight": T.Q4_K,
            "ffn_down.weight": T.Q5_K}


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.logits(model(IDS, torch.arange(IDS.shape[1])[None], model.causal_attend))


def _hf_logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits.float()


CASES = {
    "llama-legacy-quants": (dict(max_position_embeddings=4096), LEGACY_QUANTS),
    "llama-k-quants": (dict(hidden_size=256, intermediate_size=512, head_dim=64,
                            max_position_embeddings=4096), K_QUANTS),
    "qwen2-bias-tied": (dict(model_type="qwen2", qkv_bias=True, tie_word_embeddings=True,
                             max_position_embeddings=4096), {"attn_q.weight": T.Q8_0,
                                                             "ffn_up.weight": T.F16}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gguf_logits_match_transformers_loader(tmp_path, case):
    overrides, qtypes = CASES[case]
    path = write_gguf(tmp_path / "model.gguf", random_model(tiny_config(**overrides)), qtypes)
    ours = load_model(open_checkpoint(path))
    theirs = _hf_logits(hf_gguf_model(path))
    torch.testing.assert_close(_logits(ours), theirs, atol=1e-4, rtol=1e-4)


def test_f32_gguf_equals_the_same_weights_as_a_hf_directory(tmp_path):
    model = random_model(tiny_config(max_position_embeddings=4096))
    gguf_model = load_model(open_checkpoint(write_gguf(tmp_path / "m.gguf", model, {})))
    hf_model = load_model(open_checkpoint(write_hf_dir(tmp_path / "hf", model)))
    torch.testing.assert_close(_logits(gguf_model), _logits(hf_model), atol=1e-5, rtol=1e-5)
    eps = gguf_model.config.rms_norm_eps  # GGUF stores it as float32
    assert eps == pytest.approx(hf_model.config.rms_norm_eps, rel=1e-6)
    assert replace(gguf_model.config, rms_norm_eps=hf_model.config.rms_norm_eps) == \
        hf_model.config


def test_config_from_metadata(tmp_path):
    config = tiny_config(model_type="qwen2", qkv_bias=True, tie_word_embeddings=True,
                         max_position_embeddings=2048, rms_norm_eps=2.0**-16)
    path = write_gguf(tmp_path / "q.gguf", random_model(config), {})
    assert open_checkpoint(path).config == config


def test_unpermute_inverts_llama_cpp_permute():
    weight = torch.randn(4 * 16, 8)  # (heads * head_dim, in)
    permuted = torch.from_numpy(llama_cpp_permute(weight.numpy(), 4))
    assert not torch.equal(permuted, weight)
    torch.testing.assert_close(unpermute_rows(permuted, 4), weight, rtol=0, atol=0)


@pytest.mark.parametrize("pre", ["smollm", "gpt2", "llama-bpe", "qwen2"])
def test_tokenizer_matches_transformers_on_synthetic_file(tmp_path, pre):
    path = write_gguf(tmp_path / "t.gguf", random_model(tiny_config()), {}, pre=pre)
    ours, theirs = open_checkpoint(path).tokenizer(), hf_gguf_tokenizer(path)
    for text in ["the theater in a hat", "x  y\t\tz", "<|im_start|>user\nhi<|im_end|>", "ok!"]:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text
    assert ours.eos_token_ids[0] == EOS_ID
    assert ours.chat_template is not None and ours.chat_template.source == CHATML


def test_unknown_architecture_is_named(tmp_path):
    path = write_gguf(tmp_path / "g.gguf", random_model(tiny_config()), {})
    data = path.read_bytes().replace(b"llama", b"gemma")  # the architecture string and its keys
    (tmp_path / "gemma.gguf").write_bytes(data)
    with pytest.raises(ValueError, match="architecture 'gemma' is not supported"):
        open_checkpoint(tmp_path / "gemma.gguf").config  # noqa: B018


def test_unknown_pre_tokenizer_is_named(tmp_path):
    path = write_gguf(tmp_path / "p.gguf", random_model(tiny_config()), {}, pre="no-such-pre")
    with pytest.raises(ValueError, match="pre-tokenizer 'no-such-pre' is not supported"):
        open_checkpoint(path).tokenizer()


def test_not_a_model_path_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="neither a directory nor a GGUF file"):
        open_checkpoint(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match="does not exist"):
        open_checkpoint(tmp_path / "missing.gguf")


LINEARS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
           "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")


@pytest.mark.parametrize(("qtypes", "native"), [
    ({name: T.Q4_1 for name in LINEARS}, "int4"),
    ({**{name: T.Q4_0 for name in LINEARS}, "attn_v.weight": T.Q4_1}, "int4"),
    ({name: T.Q8_0 for name in LINEARS}, "int8"),
    ({**{name: T.Q5_0 for name in LINEARS}, "ffn_down.weight": T.Q8_0}, "int8"),
    ({**LEGACY_QUANTS, "ffn_up.weight": T.Q8_0, "ffn_down.weight": T.Q4_1}, "int4"),
    (LEGACY_QUANTS, "float32"),  # F16/BF16 layers: not all blocks
    ({}, "float32"),
])
def test_auto_serves_a_gguf_in_its_own_format(tmp_path, qtypes, native):
    """``native``: the down projection's layer (int4/int8 codes of the file's blocks)."""
    path = write_gguf(tmp_path / "m.gguf", random_model(tiny_config()), qtypes)
    assert open_checkpoint(path).native_format == ("float32" if native == "float32" else "gguf")
    engine = Engine.from_pretrained(path)  # dtype auto
    quantized = {"int4": Int4Linear, "int8": Int8Linear}.get(native, nn.Linear)
    assert isinstance(engine.model.model.layers[0].mlp.down_proj, quantized)
    assert engine.kv_dtype == (torch.float32 if native == "float32" else torch.int8)


def test_auto_is_float32_for_a_hugging_face_directory(tiny_model_dir):
    engine = Engine.from_pretrained(tiny_model_dir)
    assert open_checkpoint(tiny_model_dir).native_format == "float32"
    assert isinstance(engine.model.model.layers[0].mlp.down_proj, nn.Linear)


@pytest.mark.parametrize("keep", [0.001, 0.5, 0.99])
def test_a_truncated_gguf_names_the_file_and_the_fix(tmp_path, keep):
    whole = write_gguf(tmp_path / "m.gguf", random_model(tiny_config()), {}).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: int(len(whole) * keep)])
    with pytest.raises(ValueError) as info:
        checkpoint = open_checkpoint(cut)
        checkpoint.state_dict(torch.float32)
    message = str(info.value)
    assert str(cut) in message and "truncated or corrupt" in message
    assert "snapstream models pull" in message and "\n" not in message


def test_an_untied_quantized_embedding_keeps_its_blocks(tmp_path):
    """Qwen2.5's GGUFs hold token_embd and output apart, both quantized: the embedding is a
    table of codes of its own (no float copy), its rows the file's values to the bit."""
    qtypes = {name: T.Q8_0 for name in LINEARS} | {"token_embd.weight": T.Q5_0,
                                                   "output.weight": T.Q8_0}
    model = random_model(tiny_config(model_type="qwen2", qkv_bias=True))
    path = write_gguf(tmp_path / "untied.gguf", model, qtypes)
    blocks = load_model(open_checkpoint(path), keep_blocks=True)
    floats = load_model(open_checkpoint(path))
    embedding = blocks.model.embed_tokens
    assert isinstance(embedding, QuantizedEmbedding) and isinstance(embedding.table, Int8Linear)
    assert embedding.table is not blocks.lm_head
    assert "model.embed_tokens.table.weight" in blocks.state_dict()
    ids = torch.arange(blocks.config.vocab_size)
    assert torch.equal(embedding(ids), floats.model.embed_tokens(ids))
    assert torch.equal(blocks.lm_head.dequantized(), floats.lm_head.weight)
    with torch.no_grad():
        hidden = floats(IDS, torch.arange(IDS.shape[1])[None], floats.causal_attend)
        want = floats.logits(hidden)
    torch.testing.assert_close(_logits(blocks), want, atol=0.05, rtol=0.05)
