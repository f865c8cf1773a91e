"""Qwen2.5-Coder-Instruct (qwen2: Q/K/V biases, untied quantized embedding and head, ChatML
with a default system prompt) against transformers' own GGUF loader: tokenizer and template on
the 0.5B (the 1.5B's tokenizer is the same), float32 logits and greedy tokens on short prompts
on the 0.5B, and on the 1.5B a 2k-token prompt (slow tier)."""

from __future__ import annotations

import gc
import inspect
import statistics

import pytest
import torch

from snapstream.chat import ChatMessage
from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.gguf_file import GGUFFile
from snapstream.checkpoints.registry import model_path
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.quant import QuantizedEmbedding, return_freed_memory
from snapstream.sampling_params import SamplingParams
from tests.checkpoints.conftest import hf_gguf_model, hf_gguf_tokenizer

SMALL, LARGE = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
HELD_OUT = [
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "    \t\tindented\r\n\n\n  trailing   ",
    "digits 0 12 345 6789 3.14159 -42 1e10 2026-11-24 0x7fff_ffff",
    "café naïve résumé Ångström 日本語のテキスト 中文字符 한국어 emoji 🎉🚀 👩‍👩‍👧",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><|im_start|>assistant\n<|fim_prefix|>x",
    "it's they're we'll I'd CAN'T don't",
    "```python\nimport numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n```",
    "",
]
CONVERSATIONS = [
    [ChatMessage("user", "Write a Python function that checks whether a number is prime.")],
    [ChatMessage("system", "Answer with code only."), ChatMessage("user", "Reverse a list."),
     ChatMessage("assistant", "xs[::-1]"), ChatMessage("user", "And a string?")],
]
PROMPTS = [  # eight short code questions: greedy tokens equal transformers'
    "Write a Python function is_prime(n).",
    "What does `git rebase -i HEAD~3` do?",
    "Write a SQL query that returns the ten most recent orders.",
    "Fix this bug: `for i in range(len(xs)): xs.remove(xs[i])`",
    "Write a C function that reverses a string in place.",
    "Explain Python's `yield` in one sentence.",
    "Write a bash one-liner that counts the lines of every .py file.",
    "Convert this to a list comprehension: `out = []\nfor x in xs:\n    out.append(x * x)`",
]


def _reference_greedy(model, ids: list[int], steps: int) -> list[int]:
    input_ids = torch.tensor([ids])  # (1, P); an explicit mask: the prompt holds the pad id
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                             max_new_tokens=steps, do_sample=False, eos_token_id=None)
    return out[0, len(ids):].tolist()


def _greedy(engine: Engine, ids: list[int], steps: int) -> list[int]:
    return engine.generate(ids, steps, policy=CachePolicy(kind="full"),
                           sampling=SamplingParams(temperature=0, ignore_eos=True)).token_ids


def _reference(path, source: list[int], prompts: list[list[int]], steps: int
               ) -> tuple[torch.Tensor, list[list[int]]]:
    """transformers' float32 reading of the file at ``path``: the logits of the last 8
    positions of ``source`` and ``steps`` greedy tokens of each prompt; the model is gone (its
    memory given back) when this returns."""
    reference = hf_gguf_model(path)
    with torch.no_grad():
        logits = reference(torch.tensor([source]), logits_to_keep=8).logits[0].float()
    greedy = [_reference_greedy(reference, ids, steps) for ids in prompts]
    del reference
    gc.collect()
    return_freed_memory()
    return logits, greedy


@pytest.fixture(scope="module")
def tokenizers_pair():
    path = model_path(SMALL)
    return open_checkpoint(path).tokenizer(), hf_gguf_tokenizer(path)


def test_config_from_metadata():
    small, large = open_checkpoint(SMALL).config, open_checkpoint(LARGE).config
    assert (large.num_layers, large.hidden_size, large.num_heads, large.num_kv_heads,
            large.head_dim, large.intermediate_size, large.vocab_size) == (
                28, 1536, 12, 2, 128, 8960, 151936)
    assert (small.num_layers, small.hidden_size, small.num_heads, small.num_kv_heads) == (
        24, 896, 14, 2)
    for config in (small, large):
        assert config.model_type == "qwen2" and config.qkv_bias and not config.o_bias
        assert not config.tie_word_embeddings  # both files hold output.weight
        assert (config.max_position_embeddings, config.rope.theta) == (32768, 1e6)


def test_both_sizes_share_one_tokenizer_and_render_chats_alike():
    """(Their templates differ only in the tool-call instructions, which no chat without tools
    renders.)"""
    small, large = GGUFFile(model_path(SMALL)), GGUFFile(model_path(LARGE))
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.pre",
                "tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id"):
        assert small.get(key) == large.get(key), key
    templates = [open_checkpoint(name).tokenizer().chat_template for name in (SMALL, LARGE)]
    for messages in CONVERSATIONS:
        assert templates[0].render(messages) == templates[1].render(messages)


def test_token_ids_identical_to_transformers(tokenizers_pair):
    ours, theirs = tokenizers_pair
    for text in HELD_OUT:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_chatml_and_its_default_system_prompt_come_from_the_file(tokenizers_pair):
    ours, theirs = tokenizers_pair
    for messages in CONVERSATIONS:
        expected = theirs.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], tokenize=False,
            add_generation_prompt=True)
        assert ours.render_chat(messages) == expected
    rendered = ours.render_chat(CONVERSATIONS[0])
    assert rendered.startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n")
    assert rendered.endswith("<|im_start|>assistant\n")
    assert DEFAULT_SYSTEM in ours.chat_template.source  # the file's text, not ours
    assert DEFAULT_SYSTEM not in ours.render_chat(CONVERSATIONS[1])  # a system turn replaces it


def test_special_ids(tokenizers_pair):
    ours, _ = tokenizers_pair
    vocab = ours.inner.get_vocab()
    assert ours.eos_token_ids == (vocab["<|im_end|>"], vocab["<|endoftext|>"])
    assert ours.bos_token_id == vocab["<|endoftext|>"]
    assert ours.encode("hi") == [vocab["hi"]]  # no BOS (add_bos_token false)


@pytest.fixture(scope="module")
def small_reference():
    """Our float32 0.5B, the 8 chat prompts, and transformers' float32 reading of it: the
    logits of the last 8 positions of the first prompt and 16 greedy tokens of each prompt."""
    tokenizer = open_checkpoint(SMALL).tokenizer()
    prompts = [tokenizer.encode(tokenizer.render_chat([ChatMessage("user", p)]))
               for p in PROMPTS]
    logits, greedy = _reference(model_path(SMALL), prompts[0], prompts, 16)
    return Engine.from_pretrained(SMALL, dtype="float32"), prompts, logits, greedy


# loading the 0.5B twice (transformers dequantizes the file in Python) and the 1.5B twice take
# minutes on 2 cores
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_small_float32_logits_and_greedy_tokens_match_transformers(small_reference):
    engine, prompts, expected, greedy = small_reference
    model = engine.model
    with torch.no_grad():
        hidden = model(torch.tensor([prompts[0]]), torch.arange(len(prompts[0]))[None],
                       model.causal_attend)
        torch.testing.assert_close(model.logits(hidden[0, -8:]), expected, atol=1e-3, rtol=0)
    assert [_greedy(engine, ids, 16) for ids in prompts] == greedy


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_small_gguf_blocks_are_the_files_values_and_track_float32(small_reference):
    """The quantized path (the file's Q5_0/Q8_0/Q4_K/Q6_K blocks as int8/int4 codes, its own
    quantized embedding table): its weights are the file's to the bit, and teacher-forced over
    512 tokens of Python source its next-token choices agree with float32's (docs/model.md)."""
    floats = small_reference[0]
    blocks = Engine.from_pretrained(SMALL)  # auto: the file's blocks
    assert isinstance(blocks.model.model.embed_tokens, QuantizedEmbedding)
    some = torch.tensor([0, 1, 17, 9001, 151643, 151935])
    assert torch.equal(blocks.model.model.embed_tokens(some),
                       floats.model.model.embed_tokens(some))
    assert torch.equal(blocks.model.lm_head.rows(some), floats.model.lm_head.weight[some])
    down = blocks.model.model.layers[0].mlp.down_proj  # Q6_K: int8 codes in groups of 16
    assert torch.equal(down.dequantized(), floats.model.model.layers[0].mlp.down_proj.weight)
    ids = floats.tokenizer.encode(inspect.getsource(statistics))[:512]

    def logits(engine: Engine) -> torch.Tensor:
        model = engine.model
        with torch.no_grad():
            hidden = model(torch.tensor([ids]), torch.arange(len(ids))[None],
                           model.causal_attend, engine.prefill_dtype)
            return model.logits(hidden[0].float())  # (P, V)

    got, want = logits(blocks), logits(floats)
    kl = torch.nn.functional.kl_div(got.log_softmax(-1), want.log_softmax(-1), log_target=True,
                                    reduction="batchmean")
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean()
    assert kl < 0.05, kl
    assert agree > 0.85, agree


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_large_float32_matches_transformers_on_a_2k_prompt_and_8_greedy_prompts():
    """The 1.5B, one model in memory at a time (each ~7 GB in float32): transformers' logits of
    the last 8 positions of 2,048 tokens of Python source and 8 greedy tokens of each prompt,
    then ours."""
    path = model_path(LARGE)
    tokenizer = open_checkpoint(path).tokenizer()
    source = tokenizer.encode(inspect.getsource(statistics))[:2048]
    prompts = [tokenizer.encode(tokenizer.render_chat([ChatMessage("user", p)]))
               for p in PROMPTS]
    expected, greedy = _reference(path, source, prompts, 8)
    engine = Engine.from_pretrained(LARGE, dtype="float32")
    assert len(source) == 2048
    with torch.no_grad():
        model = engine.model
        hidden = model(torch.tensor([source]), torch.arange(len(source))[None],
                       model.causal_attend)
        got = model.logits(hidden[0, -8:])  # (8, V)
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=0)
    assert [_greedy(engine, ids, 8) for ids in prompts] == greedy
