"""The limits a benchmark reports against (bench.limits) and the decode worker capacity count
(bench.capacity_bench) on a tiny model; a prompt's FLOPs and attended pairs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bench.capacity_bench import _hold
from bench.kv_cli import llama_cpp_kv_bytes
from bench.limits import (
    attended_pairs,
    decode_step_bytes,
    gemm_peak,
    memory_bandwidth,
    model_bytes,
    prompt_flops,
    share_of_limit,
)
from snapstream.engine import Engine
from snapstream.kvcache import pool_row_bytes
from tests.tiny_models import random_model, tiny_config, tiny_gemma3_config


def test_model_bytes_counts_a_tied_weight_once():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied, as an LM head and its embedding
    model.register_buffer("scale", torch.ones(3, dtype=torch.bfloat16))
    assert model_bytes(model) == 10 * 4 * 4 + 3 * 2


def test_a_step_reads_the_weights_once_and_every_row():
    assert decode_step_bytes(weights=1000, row_bytes=10, batch=16) == 1160
    assert share_of_limit(seconds=2.0, work=50.0, limit_per_s=100.0) == 0.25


def test_the_limits_are_measured():
    assert memory_bandwidth(nbytes=2**24, calls=2) > 0
    [(shape, rates)] = gemm_peak(shapes=((64, 32, 16),), calls=2).items()
    assert shape == "64x32x16" and set(rates) == {"float32", "bfloat16"}
    assert min(rates.values()) > 0


def test_llama_cpp_holds_n_ctx_cells_on_global_layers_and_a_padded_window_on_sliding_ones():
    assert llama_cpp_kv_bytes((None, None), token_bytes=8, n_ctx=8192) == 2 * 8192 * 8
    # a sliding layer: pad256(min(n_ctx, window + n_ubatch 512)) cells
    assert llama_cpp_kv_bytes((None, 512), token_bytes=8, n_ctx=8192) == (8192 + 1024) * 8


def test_capacity_fills_the_budget_with_pool_rows(tiny_model_dir):
    engine = Engine.from_pretrained(tiny_model_dir, kv_dtype="int8")
    ids = [(7 * i) % 261 + 3 for i in range(297)]
    layout = engine.prefill(ids, engine.default_policy, 8).cache.layout
    row, weights = pool_row_bytes(engine.config, layout, torch.int8), model_bytes(engine.model)
    got = _hold(str(tiny_model_dir), "int8", prompt_len=297, new_tokens=8,
                budget=weights + 5 * row + row // 2, fraction=1.0, steps=1)
    assert (got["per_stream"], got["weights"]) == (row, weights)
    assert got["counted"] == got["measured_streams"] == 5
    assert got["rss"] > 0 and got["rss_base"] > 0


@pytest.mark.parametrize(("prompt_len", "window"), [(1, None), (9, None), (9, 4), (9, 9),
                                                     (4, 9)])
def test_pairs_count_the_attended_query_key_pairs(prompt_len, window):
    pos = torch.arange(prompt_len)
    mask = pos[None] <= pos[:, None]  # (T, T) causal
    if window is not None:
        mask &= pos[None] > pos[:, None] - window
    assert attended_pairs(prompt_len, window) == int(mask.sum())


@pytest.mark.parametrize("config", [tiny_config(), tiny_gemma3_config()], ids=["llama", "gemma3"])
def test_a_prompts_flops_count_every_projection_weight_and_attended_pair(config):
    """2 FLOPs per weight of the model's linear layers per token (the LM head once), 4 * D
    per query head per attended pair: counted here from the modules and a mask."""
    model = random_model(config)
    layer_weights = sum(m.weight.numel() for m in model.model.layers.modules()
                        if isinstance(m, nn.Linear))
    tokens = 40
    pos = torch.arange(tokens)
    pairs = 0
    for window in config.attention_windows:
        mask = pos[None] <= pos[:, None]
        if window is not None:
            mask &= pos[None] > pos[:, None] - window
        pairs += int(mask.sum())
    expected = (2 * layer_weights * tokens + 2 * model.lm_head.weight.numel()
                + 4 * config.head_dim * config.num_heads * pairs)
    assert prompt_flops(config, tokens) == pytest.approx(expected)
