"""The fused decode layer (snapstream::decode_layer) computes what the module path computes,
bit for bit: the same logits and the same cache writes, step after step."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from snapstream.config import FULL, SLIDING
from snapstream.decode import Decoder
from snapstream.fused_decode import fused_layers, runs_fused
from snapstream.kvcache import BatchCache
from snapstream.kvquant import as_bits
from snapstream.policy import CachePolicy
from snapstream.quant import (
    GEMM_MIN_ROWS,
    QUANT_SCHEMES,
    Int4Linear,
    Int8Linear,
    QuantScheme,
    quantize_int4_groups,
    quantize_model,
)
from tests.engine.helpers import engine_for, greedy_with_logits
from tests.tiny_models import random_model, tiny_config, tiny_gemma3_config

POLICY = CachePolicy(n_sink=4, n_topk=24, n_recent=16, observation=8)
CONFIGS = {  # Llama; Llama with two sliding-window layers around a global one; Gemma 3
    "llama": tiny_config,
    "hybrid": lambda: tiny_config(num_layers=3, layer_types=(SLIDING, FULL, SLIDING),
                                  sliding_window=20),
    "gemma3": tiny_gemma3_config,  # q/k and post norms, GELU, scaled embeddings and queries
    "qwen2": lambda: tiny_config(model_type="qwen2", qkv_bias=True),  # a QKV bias
}


def k_quant_layer(linear: nn.Linear) -> Int4Linear:
    """``linear`` as int4 groups whose scales and offsets are int8 multiples of a float16
    factor per row, as a GGUF K-quant's (held as int8 codes beside the factors)."""
    codes = quantize_int4_groups(linear.weight)
    parts = torch.stack([codes.scales, codes.offsets], dim=-1)  # (N, G, 2)
    factors = (parts.abs().amax(1, keepdim=True) / 127).half().float()  # (N, 1, 2)
    values = torch.where(factors == 0, 0.0, parts / factors).round() * factors  # exact
    return Int4Linear(replace(codes, scales=values[..., 0], offsets=values[..., 1],
                              factors=factors), linear.bias)


def x8_layer(linear: nn.Linear) -> Int4Linear:
    """``linear`` as int4 groups taking x in 8-bit codes."""
    layer = Int4Linear.from_linear(linear)
    layer.x_bits = 8
    return layer


SCHEMES = {**QUANT_SCHEMES,
           "k-quant": QuantScheme(layers=k_quant_layer, head=Int8Linear.from_linear),
           "int4-x8": QuantScheme(layers=x8_layer, head=Int8Linear.from_linear)}


def quantized_engine(scheme: str, kv_dtype: torch.dtype, family: str = "llama"):
    model = quantize_model(random_model(CONFIGS[family]()), SCHEMES[scheme])
    return engine_for(model, kv_dtype=kv_dtype)


def twin_decoders(engine, prompts: list[list[int]]) -> tuple[Decoder, Decoder, list[int]]:
    """A fused and a module-path decoder over the same rows (one prompt each) -> both and the
    rows' next positions."""
    results = [engine.prefill(ids, POLICY, max_new_tokens=16) for ids in prompts]
    layout = results[0].cache.layout
    pools = []
    for fuse in (True, False):
        cache = BatchCache(engine.config, layout, len(prompts), engine.kv_dtype)
        for row, result in enumerate(results):
            cache.insert(row, result.cache)
        pools.append(Decoder(engine.model, cache, fuse=fuse))
    return *pools, [result.cache.next_position for result in results]


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn, torch.bfloat16,
                                      torch.float32])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_fused_step_equals_module_step(scheme, kv_dtype, family):
    engine = quantized_engine(scheme, kv_dtype, family)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 200, (length,), generator=gen).tolist()
               for length in (90, 23, 57)]
    fused, modules, next_positions = twin_decoders(engine, prompts)
    assert fused._fused is not None and modules._fused is None
    tokens, positions = torch.tensor([5, 6, 7]), torch.tensor(next_positions)
    for _ in range(6):
        got, expected = fused.step(tokens, positions), modules.step(tokens, positions)
        assert torch.equal(got, expected)
        tokens, positions = expected.argmax(-1), positions + 1
    for got, expected in zip(fused.cache.groups, modules.cache.groups, strict=True):
        assert torch.equal(as_bits(got.k), as_bits(expected.k))
        assert torch.equal(as_bits(got.v), as_bits(expected.v))
        assert torch.equal(got.filled, expected.filled)


def test_only_quantized_layers_fuse():
    assert fused_layers(random_model(tiny_config())) is None  # float weights: modules
    model = quantize_model(random_model(tiny_config()), QUANT_SCHEMES["int4"])
    layers = fused_layers(model)
    assert layers is not None and len(layers) == model.config.num_layers
    assert {len(layer.params) for layer in layers} == {14} and layers[0].activation == "silu"
    gemma = fused_layers(quantize_model(random_model(tiny_gemma3_config()), QUANT_SCHEMES["int8"]))
    assert {len(layer.params) for layer in gemma} == {18} and gemma[0].activation == "gelu_tanh"
    assert runs_fused(layers, GEMM_MIN_ROWS - 1) and not runs_fused(layers, GEMM_MIN_ROWS)


def test_x_bits_go_to_the_op_and_a_layer_of_two_widths_keeps_the_modules():
    model = quantize_model(random_model(tiny_config()), SCHEMES["int4-x8"])
    assert {layer.x_bits for layer in fused_layers(model)} == {8}
    model.model.layers[1].mlp.down_proj.x_bits = 15
    assert fused_layers(model) is None


def test_a_qkv_bias_goes_to_the_op_and_others_keep_the_modules():
    model = quantize_model(random_model(CONFIGS["qwen2"]()), QUANT_SCHEMES["int4"])
    layers = fused_layers(model)
    assert {len(layer.params) for layer in layers} == {14}
    for layer, module in zip(layers, model.model.layers, strict=True):
        assert torch.equal(layer.qkv_bias, module.self_attn.qkv_proj.bias)
        assert layer.qkv_bias.dtype == torch.float32
    hidden = model.config.hidden_size
    model.model.layers[0].self_attn.o_proj.bias = nn.Parameter(torch.zeros(hidden))
    assert fused_layers(model) is None  # a bias the op does not take: modules


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_module_path_with_a_qkv_bias_decodes_as_the_prompt_forward(scheme):
    """Qwen2's QKV bias through the quantized layers: each decode step's logits equal the
    forward of the whole sequence (both below GEMM_MIN_ROWS rows: the same kernels), and the
    bias changes them."""
    engine = quantized_engine(scheme, torch.float32, "qwen2")
    ids = torch.randint(0, 200, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    full = CachePolicy(kind="full")
    tokens, logits, _ = greedy_with_logits(engine, ids, full, steps=8)
    model = engine.model
    with torch.no_grad():
        sequence = torch.tensor([ids + tokens[:-1]])  # (1, 37)
        hidden = model(sequence, torch.arange(sequence.shape[1])[None], model.causal_attend)
        expected = model.logits(hidden[0, len(ids) - 1:])  # (8, V)
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
        for layer in model.model.layers:
            layer.self_attn.qkv_proj.bias.zero_()
        unbiased = model.logits(model(sequence, torch.arange(sequence.shape[1])[None],
                                      model.causal_attend)[0, len(ids) - 1:])
    assert (unbiased - expected).abs().max() > 1e-2


def test_decode_layer_rejects_a_mismatched_weight():
    engine = quantized_engine("int4", torch.int8)
    layer = fused_layers(engine.model)[0]
    params = list(layer.params)
    params[1:4] = params[11:14]  # the down projection (128 inputs: weight, scales, factors) as QKV
    fused, _, positions = twin_decoders(engine, [[1, 2, 3]])
    group = fused.cache.groups[0]
    cos = sin = torch.ones(1, 1, 1, engine.config.head_dim)
    with pytest.raises(RuntimeError, match="QKV projection takes 128 inputs, the layer gives"):
        torch.ops.snapstream.decode_layer(
            torch.zeros(1, engine.config.hidden_size), params, cos, sin, group.k[0],
            group.v[0], torch.tensor(positions), ~group.filled, layer.num_heads, layer.eps,
            layer.q_factor, layer.activation)


def test_compiled_fused_step_equals_module_step():
    engine = quantized_engine("int4", torch.int8)
    _, modules, positions = twin_decoders(engine, [[1, 2, 3, 4, 5] * 10, [7] * 30])
    compiled = Decoder(engine.model, BatchCache(engine.config, modules.cache.layout, 2,
                                                engine.kv_dtype), compile=True)
    for got, source in zip(compiled.cache.groups, modules.cache.groups, strict=True):
        got.k.copy_(source.k), got.v.copy_(source.v), got.filled.copy_(source.filled)
    assert compiled._fused is not None
    tokens, positions = torch.tensor([3, 4]), torch.tensor(positions)
    for _ in range(3):
        expected = modules.step(tokens, positions)
        assert torch.equal(compiled.step(tokens, positions), expected)
        tokens, positions = expected.argmax(-1), positions + 1
