"""A worker's memory by component and the longest prompt it admits under its limit."""

from __future__ import annotations

import pytest
import torch

from snapstream.memory import MemoryExhausted
from snapstream.memory_plan import (
    GIB,
    PrefillMemory,
    gemm_weight_bytes,
    held_bytes,
    memory_limit,
    parse_size,
    prefill_activation_bytes,
    prefill_memory,
)
from snapstream.quant import QUANT_SCHEMES, quantize_model
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config

QWEN_15B = tiny_config(model_type="qwen2", qkv_bias=True, vocab_size=151936, hidden_size=1536,
                       intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2,
                       head_dim=128, max_position_embeddings=32768)


@pytest.mark.parametrize(("text", "expected"), [
    ("4096", 4096), ("8GiB", 8 * GIB), ("8G", 8 * GIB), ("512MiB", 512 << 20),
    ("1.5g", 3 * GIB // 2), ("64 KiB", 64 << 10), ("2T", 2 << 40), ("7B", 7)])
def test_sizes_parse_in_powers_of_1024(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "8 GB extra", "-1G", "1e9"])
def test_a_bad_size_says_what_to_write(text):
    with pytest.raises(ValueError, match="such as 8GiB"):
        parse_size(text)


def test_a_given_limit_wins():
    assert memory_limit("3GiB") == 3 * GIB
    assert memory_limit(None) > 0  # the cgroup's, or what the machine has


def test_held_and_gemm_bytes_count_what_a_quantized_model_holds():
    model = random_model(tiny_config(tie_word_embeddings=True))
    floats = held_bytes(model)
    assert floats == sum(t.nbytes for t in (*model.parameters(), *model.buffers()))  # tied: once
    quantized = quantize_model(model, QUANT_SCHEMES["int4"])
    assert held_bytes(quantized) < floats / 2
    config = quantized.config
    per_layer = (config.hidden_size * (config.num_heads + 2 * config.num_kv_heads)
                 * config.head_dim + config.num_heads * config.head_dim * config.hidden_size
                 + 3 * config.hidden_size * config.intermediate_size)
    assert gemm_weight_bytes(quantized, torch.float32) == 4 * config.num_layers * per_layer
    assert gemm_weight_bytes(quantized, torch.bfloat16) == 2 * config.num_layers * per_layer


def test_activations_grow_with_the_prompt_and_the_mlp_is_bounded():
    sizes = [prefill_activation_bytes(QWEN_15B, n, torch.float32) for n in (1, 2048, 32768)]
    assert sizes[0] < sizes[1] < sizes[2]
    past_chunk = [prefill_activation_bytes(QWEN_15B, n, torch.float32)
                  for n in (4096, 8192, 12288)]  # the MLP's chunk is full: linear from here
    assert past_chunk[1] - past_chunk[0] == pytest.approx(past_chunk[2] - past_chunk[1], abs=2)
    assert prefill_activation_bytes(QWEN_15B, 32768, torch.bfloat16) < sizes[2]


def _memory(limit: int, held: int = 2 * GIB) -> PrefillMemory:
    return PrefillMemory(config=QWEN_15B, dtype=torch.float32, limit=limit, weights=GIB,
                         gemm_weights=GIB // 2, held=held)


def test_the_longest_prompt_admitted_is_the_longest_that_fits():
    memory = _memory(limit=4 * GIB)
    longest = memory.max_prompt_tokens
    assert 0 < longest < QWEN_15B.max_position_embeddings
    free = memory.limit - memory.held
    assert prefill_activation_bytes(QWEN_15B, longest, torch.float32) <= free
    assert prefill_activation_bytes(QWEN_15B, longest + 1, torch.float32) > free
    memory.check_prompt(longest)
    with pytest.raises(MemoryExhausted) as info:
        memory.check_prompt(longest + 1)
    message = str(info.value)
    assert f"up to {longest} tokens" in message and "retry on a worker with more memory" in message
    report = memory.report()
    assert report["max_prompt_tokens"] == longest and report["held"] == 2 * GIB


def test_a_roomy_worker_admits_the_whole_context_and_a_full_one_nothing():
    assert _memory(limit=64 * GIB).max_prompt_tokens == QWEN_15B.max_position_embeddings
    full = _memory(limit=2 * GIB)
    assert full.max_prompt_tokens == 0
    with pytest.raises(MemoryExhausted):
        full.check_prompt(1)


def test_a_warm_prefill_worker_measures_itself():
    engine = engine_for(quantize_model(random_model(tiny_config()), QUANT_SCHEMES["int8"]))
    engine.warm_up_prefill()
    memory = prefill_memory(engine, limit=64 * GIB)
    assert memory.weights == held_bytes(engine.model)
    assert memory.gemm_weights == gemm_weight_bytes(engine.model, engine.prefill_dtype) > 0
    assert memory.held > memory.weights + memory.gemm_weights  # and the runtime, torch's
    assert memory.max_prompt_tokens == engine.context_len
