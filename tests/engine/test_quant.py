"""Weight-only int8/int4 layers (snapstream.quant) and the Engine dtypes built on them."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kvstore.codec import decode_blob, encode_blob
from kvstore.seal import ClusterSecret, Seal
from serving.settings import add_dtype_setting
from serving.worker import blob_spec
from snapstream import kernels
from snapstream.cpu import MATMUL_DTYPE_ENV, matmul_dtype_name
from snapstream.engine import Engine
from snapstream.fingerprint import model_fingerprint
from snapstream.kvquant import kv_slot_bytes
from snapstream.policy import CachePolicy
from snapstream.quant import (
    GEMM_MIN_ROWS,
    QUANTIZED_LINEARS,
    GroupedCodes,
    Int4Linear,
    Int8Linear,
    QuantizedEmbedding,
    QuantizedLinear,
    quantize_int4_groups,
    quantize_int8_rows,
    use_int4_x_bits,
)
from snapstream.sampling_params import SamplingParams
from snapstream.weight_formats import DTYPE_CHOICES, WEIGHT_FORMATS

ROOT = Path(__file__).resolve().parents[2]  # this checkout, first on the child's path


def spread_linear(n: int, k: int, bias: bool = False, seed: int = 0) -> nn.Linear:
    """Rows whose magnitudes differ by up to ~50x, so one shared scale would be far off."""
    torch.manual_seed(seed)
    linear = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k) * torch.exp(2 * torch.randn(n, 1)))
    return linear


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).detach().norm() / want.detach().norm())


@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_tracks_float_linear(bias):
    linear = spread_linear(96, 128, bias)
    layer = Int8Linear.from_linear(linear)
    x = torch.randn(3, 5, 128)  # (B, T, K)
    got, want = layer(x), linear(x)
    assert got.shape == want.shape == (3, 5, 96) and got.dtype == torch.float32
    # int8 rounding (~0.5%) + bfloat16 activations (~0.3%); wrong scales are off by ~100%
    assert rel_error(got, want) < 0.02
    rows = (got - want).norm(dim=(0, 1)) / want.norm(dim=(0, 1))  # (N,): each row's own scale
    assert rows.max() < 0.05


def test_int8_rows_error_is_half_a_step_of_each_row():
    weight = spread_linear(64, 64).weight.detach()
    codes = quantize_int8_rows(weight)
    q, scales = codes.codes, codes.scales
    assert q.dtype == torch.int8 and scales.shape == (64, 1) and codes.offsets is None
    deq = q.float() * scales
    step = scales
    assert ((deq - weight).abs() <= step / 2 + 1e-6).all()
    assert (q.abs().amax(dim=1) >= 126).all()  # each row uses its whole range


def test_int4_groups_error_is_half_a_step_of_each_group():
    weight = spread_linear(32, 128).weight.detach()
    codes = quantize_int4_groups(weight, group=32)
    q = codes.codes
    assert q.shape == (32, 128) and int(q.min()) >= 0 and int(q.max()) <= 15
    assert codes.scales.shape == codes.offsets.shape == (32, 4)  # (N, K/group)
    deq = q.view(32, 4, 32).float() * codes.scales[..., None] + codes.offsets[..., None]
    step = codes.scales[..., None]  # (N, G, 1)
    assert ((deq - weight.view(32, 4, 32)).abs() <= step * 0.51 + 1e-6).all()


def test_int4_linear_tracks_float_linear():
    linear = spread_linear(48, 96, bias=True)
    x = torch.randn(7, 96)
    got, want = Int4Linear.from_linear(linear)(x), linear(x)
    assert rel_error(got, want) < 0.15  # 4 bits: step/range 1/15 per group of 32


@pytest.mark.parametrize("gemm_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("layer_type", [Int8Linear, Int4Linear])
def test_many_rows_take_the_dequantized_gemm_with_the_kernels_weight(monkeypatch, layer_type,
                                                                     gemm_dtype):
    monkeypatch.setenv(MATMUL_DTYPE_ENV, gemm_dtype)
    layer = layer_type.from_linear(spread_linear(48, 96, bias=True))
    x = torch.randn(GEMM_MIN_ROWS + 3, 96)
    assert "gemm_weight" not in layer.__dict__
    rows = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])  # one row: the kernel
    assert "gemm_weight" not in layer.__dict__
    many = layer(x)  # GEMM_MIN_ROWS or more: the GEMM on the dequantized weight
    assert layer.gemm_weight.shape == (48, 96)
    assert layer.gemm_weight.dtype == getattr(torch, gemm_dtype)
    # the same weight up to its bfloat16 rounding (and int8's rounding of x to 8-bit codes); a
    # transposed or mis-scaled one is off by ~1
    assert rel_error(many, rows) < 0.01
    assert "gemm_weight" not in layer.state_dict()


@pytest.mark.parametrize("layer_type", [Int8Linear, Int4Linear])
def test_the_packed_gemm_weight_multiplies_as_the_plain_one(monkeypatch, layer_type):
    # the GEMM weight is kept in oneDNN's blocked layout: in bfloat16 the same products as
    # F.linear on the plain dequantized weight, to the bit, bias included
    monkeypatch.setenv(MATMUL_DTYPE_ENV, "bfloat16")
    layer = layer_type.from_linear(spread_linear(48, 96, bias=True))
    x = torch.randn(2, GEMM_MIN_ROWS, 96).bfloat16()
    assert layer.gemm_weight.is_mkldnn == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    plain = layer.dequantized().bfloat16()  # (N, K)
    want = F.linear(x, plain) + layer.bias.bfloat16()
    assert torch.equal(layer(x), want)


def test_a_long_prefill_leaves_the_fingerprint_as_it_was(tiny_model_dir):
    engine = Engine.from_pretrained(tiny_model_dir, dtype="int4")
    before = model_fingerprint(engine.model)
    engine.prefill([40 + i % 200 for i in range(GEMM_MIN_ROWS + 8)], CachePolicy(kind="full"), 1)
    assert "gemm_weight" in engine.model.model.layers[0].mlp.down_proj.__dict__
    assert model_fingerprint(engine.model) == before  # blobs of either path still match

    with pytest.raises(ValueError, match="divisible by 32"):
        Int4Linear.from_linear(nn.Linear(48, 32))
    with pytest.raises(ValueError, match="groups of an even number of inputs"):
        Int8Linear.from_linear(nn.Linear(63, 32))


def test_prefill_warm_up_makes_every_gemm_weight_a_prompt_uses(tiny_model_dir):
    engine = Engine.from_pretrained(tiny_model_dir, dtype="int4")
    layers = [m for m in engine.model.model.layers.modules() if isinstance(m, QuantizedLinear)]
    assert layers and not any("gemm_weight" in m.__dict__ for m in layers)

    def made() -> list[bool]:
        return ["gemm_weight" in m.__dict__ for m in layers]

    assert engine.warm_up_prefill() > 0
    warmed = made()
    ids = [i % engine.config.vocab_size for i in range(3 * GEMM_MIN_ROWS)]
    engine.prefill(ids, CachePolicy(kind="full"), 4)
    assert made() == warmed  # a first prompt finds them made
    # every layer's but the final one's output projection and MLP, which run for the last
    # position alone (the int4 kernel, no GEMM copy)
    final = engine.model.model.layers[-1]
    alone = {id(final.self_attn.o_proj), id(final.mlp.gate_up_proj), id(final.mlp.down_proj)}
    assert warmed == [id(m) not in alone for m in layers]

def test_int8_embedding_reads_the_heads_rows():
    head = Int8Linear.from_linear(spread_linear(50, 64))
    embedding = QuantizedEmbedding(head, torch.float32)
    ids = torch.tensor([[0, 7, 49], [3, 3, 1]])
    assert torch.equal(embedding(ids), head.dequantized()[ids])


@pytest.fixture(scope="module")
def engines(tiny_model_dir) -> dict[str, Engine]:
    return {dtype: Engine.from_pretrained(tiny_model_dir, dtype=dtype)
            for dtype in ("float32", "int8", "int4")}


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_quantized_engine_logits_track_float32(engines, dtype):
    ids = list(range(40, 100))
    policy = CachePolicy(kind="full")
    ref = engines["float32"].prefill(ids, policy, 1).logits
    got = engines[dtype].prefill(ids, policy, 1).logits
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    # measured: int8 0.9% (bfloat16 weights: 0.4%), int4 5.5% (4 bits of Gaussian weights)
    bound = {"int8": 0.03, "int4": 0.1}[dtype]
    assert rel_error(got, ref) < bound
    assert torch.corrcoef(torch.stack([ref, got]))[0, 1] > 1 - bound / 10
    assert engines[dtype].dtype == torch.float32  # activations


def test_the_gemm_dtype_follows_the_cpus_bfloat16_instructions(monkeypatch):
    assert matmul_dtype_name(frozenset({"avx512f", "avx512bw", "avx512_vnni"})) == "float32"
    assert matmul_dtype_name(frozenset({"avx512f", "avx512_bf16"})) == "bfloat16"
    assert matmul_dtype_name(frozenset({"amx_tile", "amx_bf16"})) == "bfloat16"
    monkeypatch.setenv(MATMUL_DTYPE_ENV, "float32")
    assert matmul_dtype_name(frozenset({"amx_bf16"})) == "float32"
    assert WEIGHT_FORMATS["gguf"].prefill_dtype == "float32"
    assert WEIGHT_FORMATS["bfloat16"].prefill_dtype == "bfloat16"  # not a quantized format
    monkeypatch.setenv(MATMUL_DTYPE_ENV, "float16")
    with pytest.raises(ValueError, match="SNAPSTREAM_MATMUL_DTYPE must be one of"):
        matmul_dtype_name()


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_quantized_prompt_runs_in_the_gemm_dtype_and_tracks_a_float32_prompt(engines, dtype):
    """The quantized formats run the prompt forward in the CPU's GEMM dtype (decode stays
    float32); in bfloat16 the same weights give nearly the logits and kept positions of float32
    prompt activations."""
    assert (engines[dtype].prefill_dtype, engines[dtype].dtype) == (
        getattr(torch, matmul_dtype_name()), torch.float32)
    assert engines["float32"].prefill_dtype == torch.float32
    served, fp32 = (Engine(engines[dtype].model, engines[dtype].tokenizer,
                           kv_dtype=engines[dtype].kv_dtype, prefill_dtype=prompt_dtype)
                    for prompt_dtype in (torch.bfloat16, torch.float32))
    seen = []
    hook = served.model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda _module, args: seen.append(args[0].dtype))
    policy = CachePolicy(kind="snapstream", n_sink=2, n_topk=24, n_recent=16, observation=8)
    ids = [40 + i % 200 for i in range(GEMM_MIN_ROWS + 72)]
    try:
        got, want = served.prefill(ids, policy, 8), fp32.prefill(ids, policy, 8)
    finally:
        hook.remove()
    assert seen == [torch.bfloat16, torch.float32]
    assert got.logits.dtype == torch.float32
    assert rel_error(got.logits, want.logits) < 0.03  # measured: ~1%
    (kept_bf16,), (kept_fp32,) = got.cache.groups, want.cache.groups
    assert kept_bf16.positions.shape == kept_fp32.positions.shape
    shared = [len(set(a.tolist()) & set(b.tolist())) / len(a) for a, b in zip(
        kept_bf16.positions.flatten(0, 1), kept_fp32.positions.flatten(0, 1), strict=True)]
    assert sum(shared) / len(shared) > 0.9  # a few ties of the SnapKV vote may flip


def test_float_layers_refuse_a_prompt_in_another_dtype(engines):
    reference = engines["float32"]
    with pytest.raises(ValueError, match="needs quantized linear layers"):
        Engine(reference.model, reference.tokenizer, prefill_dtype=torch.bfloat16)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_quantized_engines_keep_an_int8_kv_cache(engines, dtype):
    engine, reference = engines[dtype], engines["float32"]
    assert engine.kv_dtype == torch.int8 and reference.kv_dtype == torch.float32
    policy = CachePolicy(kind="snapstream", n_sink=2, n_topk=12, n_recent=16, observation=8)
    result = engine.prefill(list(range(40, 100)), policy, 8)
    layout = result.cache.layout
    (part,) = result.cache.groups
    assert part.k.dtype == part.v.dtype == torch.int8
    assert engine.new_decoder(layout, 2).cache.groups[0].k.dtype == torch.int8
    spec, reference_spec = blob_spec(engine), blob_spec(reference)
    assert spec.dtype == torch.int8
    slots = engine.config.num_layers * engine.config.num_kv_heads * policy.budget
    head_dim = engine.config.head_dim
    # K and V rows of D codes + a float32 scale instead of D float32s; the int32 positions stay
    assert reference_spec.payload_size(layout) - spec.payload_size(layout) == slots * (
        kv_slot_bytes(torch.float32, head_dim) - kv_slot_bytes(torch.int8, head_dim))
    seal = Seal(ClusterSecret(b"a test cluster secret"), "blob-key")
    blob = encode_blob(result.cache, spec, seal)
    assert decode_blob(blob, spec, seal, layout=layout).groups[0].k.dtype == torch.int8


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_quantized_engine_generates_through_the_cache(engines, dtype):
    engine = engines[dtype]
    assert isinstance(engine.model.lm_head, Int8Linear)
    assert isinstance(engine.model.model.embed_tokens, QuantizedEmbedding)  # tiny model is tied
    layer_type = Int8Linear if dtype == "int8" else Int4Linear
    assert isinstance(engine.model.model.layers[0].mlp.down_proj, layer_type)
    out = engine.generate("the cat", max_new_tokens=12, sampling=SamplingParams(ignore_eos=True))
    assert len(out.token_ids) == 12
    assert engine.fingerprint != engines["float32"].fingerprint  # blobs do not mix


def test_untied_model_keeps_a_float_embedding(llama_dir):
    engine = Engine.from_pretrained(llama_dir, dtype="int8")
    assert isinstance(engine.model.model.embed_tokens, nn.Embedding)
    assert isinstance(engine.model.lm_head, Int8Linear)
    assert len(engine.generate([5, 6, 7], max_new_tokens=4).token_ids) >= 1


def test_bad_dtype_names_the_choices(tiny_model_dir):
    with pytest.raises(ValueError, match=r"dtype must be one of .*'float32'.*'int8'.*'int9'"):
        Engine.from_pretrained(tiny_model_dir, dtype="int9")


def test_cli_dtype_choices_come_from_the_registry(monkeypatch):
    assert {"float32", "bfloat16", "int8", "int4"} <= set(DTYPE_CHOICES)
    parser = argparse.ArgumentParser()
    add_dtype_setting(parser)
    assert parser.parse_args(["--dtype", "int8"]).dtype == "int8"
    monkeypatch.setenv("SNAPSTREAM_DTYPE", "int4")
    parser = argparse.ArgumentParser()
    add_dtype_setting(parser)
    assert parser.parse_args([]).dtype == "int4"
    monkeypatch.setenv("SNAPSTREAM_DTYPE", "fp16")
    with pytest.raises(ValueError, match=r"SNAPSTREAM_DTYPE='fp16'.*int8"):
        add_dtype_setting(argparse.ArgumentParser())


def grouped_codes(n: int, k: int, bits: int, group: int, offsets: bool, half: bool,
                  seed: int = 0) -> GroupedCodes:
    """Random codes with per-group scales (float16-exact when ``half``) and offsets."""
    gen = torch.Generator().manual_seed(seed)
    low, high = (0, 16) if bits == 4 else (-128, 128)
    codes = torch.randint(low, high, (n, k), generator=gen)
    scales = torch.rand(n, k // group, generator=gen) * torch.exp(torch.randn(n, 1, generator=gen))
    shift = torch.randn(n, k // group, generator=gen) if offsets else None
    if half:
        scales = scales.half().float()
        shift = None if shift is None else shift.half().float()
    return GroupedCodes(codes.to(torch.uint8 if bits == 4 else torch.int8), scales, shift, bits)


def test_scales_are_float16_only_where_exact():
    exact = Int8Linear(grouped_codes(32, 64, 8, 32, offsets=True, half=True))
    inexact = Int8Linear(grouped_codes(32, 64, 8, 32, offsets=True, half=False))
    assert exact.scales.dtype == torch.float16 and inexact.scales.dtype == torch.float32
    assert exact.scales.shape == (2, 2, 2, 16)  # (N/16, K/G, scale and offset, 16)
    assert Int4Linear(grouped_codes(32, 64, 4, 32, offsets=False, half=True)).scales.shape == (
        2, 2, 1, 16)  # no offsets: none stored


GROUPINGS = [  # (bits, group, offsets, float16 scales): the GGUF types' and requantized ones
    (4, 32, True, True), (4, 32, True, False), (4, 32, False, True),
    (8, 32, False, True), (8, 32, True, False), (8, 16, False, False), (8, 96, False, False)]


def activation_codes(x: torch.Tensor, group: int, limit: int = 127) -> torch.Tensor:
    """What a codes kernel multiplies for x (M, K) bfloat16 with weight groups of ``group``:
    each sub-group of gcd(group, 32) inputs rounded to integer codes in [-limit, limit] times
    max |x| / limit (int8 kernels: 8-bit codes; the int4 codes kernel: 15-bit), as float32
    (M, K)."""
    sub = math.gcd(group, 32)
    values = x.float().view(len(x), -1, sub)  # (M, K/A, A)
    amax = values.abs().amax(-1, keepdim=True)  # (M, K/A, 1)
    # limit / amax as the kernels divide (a Python number over a tensor is a reciprocal times it)
    inv = torch.where(amax > 0, torch.full_like(amax, limit) / amax, torch.zeros_like(amax))
    codes = torch.round(values * inv).clamp_(-limit, limit)
    return (codes * (amax / limit)).view_as(x.float())


@pytest.mark.parametrize("cap", kernels.distinct_caps())
@pytest.mark.parametrize("grouping", GROUPINGS)
@pytest.mark.parametrize("n", [24, 50, 64])  # outputs filling part of the last block of 16
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 17, 33])  # tiles of 8 (16 on AMX), passes of 32
def test_quantized_kernels_compute_x_times_the_dequantized_weight(kernel_cap, cap,
                                                                  grouping, n, rows):
    """int8: x's 8-bit codes (per sub-group of up to 32 inputs) @ the float32 weight; int4: x
    (rounded to bfloat16), or where its kernel reads codes (the integer kernels) x's
    15-bit codes, @ the float32 weight; all up to float32 rounding (a weight off by one int4
    step, a swapped pair, a wrong scale, unscaled codes or a code byte lost are off by
    >1e-3)."""
    kernel_cap(cap)
    bits, group, offsets, half = grouping
    codes = grouped_codes(n, 96, bits, group, offsets, half, seed=n)
    layer = QUANTIZED_LINEARS[bits](codes)
    groups = 96 // group
    want_weight = codes.codes.float().view(n, groups, group) * codes.scales[..., None]
    if offsets:
        want_weight = want_weight + codes.offsets[..., None]
    assert torch.equal(layer.dequantized(), want_weight.view(n, 96))
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    got = layer.kernel(x)
    if bits == 8:
        x_used = activation_codes(x, group)
    elif torch.ops.snapstream.int4_matmul_reads_codes(group):
        x_used = activation_codes(x, group, limit=16383)
    else:
        x_used = x.float()
    want = F.linear(x_used, layer.dequantized())
    if offsets:  # an offset multiplies the sum of x itself, not of its codes
        sums = (x.float() - x_used).view(rows, groups, group).sum(-1)  # (M, G)
        want = want + sums @ codes.offsets.T
    assert got.shape == (rows, n) and got.dtype == torch.float32
    # float32 rounding, amplified where a group's offset cancels most of its sum: ~1e-5
    assert rel_error(got, want) < 1e-4


@pytest.mark.parametrize("cap", kernels.distinct_caps())
@pytest.mark.parametrize("grouping", [g for g in GROUPINGS if g[0] == 4])
@pytest.mark.parametrize("rows", [1, 3, 8, 9])
def test_int4_kernels_take_x_in_8_bit_codes_where_they_read_codes(kernel_cap, cap, grouping,
                                                                   rows):
    """x_bits 8: an integer int4 kernel multiplies x's 8-bit codes (the int8 kernels' rounding)
    by the weight, up to float32 rounding (a kernel still adding low bytes, or scaling by the
    15-bit dx, is off by far more); a kernel of bfloat16 products takes x as it is."""
    kernel_cap(cap)
    bits, group, offsets, half = grouping
    codes = grouped_codes(50, 96, bits, group, offsets, half, seed=rows)
    layer = Int4Linear(codes)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    fine = layer.kernel(x)
    layer.x_bits = 8
    got = layer.kernel(x)
    if not torch.ops.snapstream.int4_matmul_reads_codes(group):
        assert torch.equal(got, fine)
        return
    x_used = activation_codes(x, group, limit=127)
    want = F.linear(x_used, layer.dequantized())
    if offsets:  # an offset multiplies the sum of x itself, not of its codes
        sums = (x.float() - x_used).view(rows, -1, group).sum(-1)  # (M, G)
        want = want + sums @ codes.offsets.T
    assert rel_error(got, want) < 1e-4
    assert rel_error(got, fine) > 1e-4  # 8-bit codes are coarser than 15-bit ones


def test_int4_x_bits_other_than_15_or_8_are_refused():
    layer = Int4Linear.from_linear(spread_linear(32, 64))
    with pytest.raises(RuntimeError, match="x_bits is 15 or 8, got 12"):
        torch.ops.snapstream.int4_matmul(torch.zeros(1, 64, dtype=torch.bfloat16), layer.weight,
                                         layer.scales, 32, None, 12)
    with pytest.raises(ValueError, match=r"codes of \(15, 8\) bits, not 4"):
        use_int4_x_bits(nn.Sequential(layer), 4)
    assert layer.x_bits == 15
    use_int4_x_bits(nn.Sequential(layer, Int8Linear.from_linear(spread_linear(32, 64))), 8)
    assert layer.x_bits == 8


def factored_codes(n: int, k: int, bits: int, group: int, offsets: bool,
                   seed: int = 0) -> GroupedCodes:
    """Random codes whose scales (and offsets) are int8 multiples of a float16 factor per 256
    inputs, as a GGUF K-quant's d * sc (and -dmin * m)."""
    gen = torch.Generator().manual_seed(seed)
    low, high = (0, 16) if bits == 4 else (-128, 128)
    codes = torch.randint(low, high, (n, k), generator=gen)
    parts = 2 if offsets else 1
    factors = (torch.randn(n, k // 256, parts, generator=gen) / 64).half().float()  # (N, F, S)
    multiples = torch.randint(-128, 128, (n, k // group, parts), generator=gen).float()
    values = multiples * factors.repeat_interleave(256 // group, dim=1)  # (N, G, S), exact
    return GroupedCodes(codes.to(torch.uint8 if bits == 4 else torch.int8), values[..., 0],
                        values[..., 1] if offsets else None, bits, factors)


FACTORED = [(4, 32, True), (8, 32, True), (8, 16, False)]  # Q4_K, Q5_K, Q6_K


@pytest.mark.parametrize("cap", kernels.distinct_caps())
@pytest.mark.parametrize("factoring", FACTORED)
@pytest.mark.parametrize("rows", [1, 5, 9, 17])
def test_factored_scales_compute_what_their_float_values_do(kernel_cap, cap, factoring, rows):
    """Scales held as int8 codes times a factor per 256 inputs (a quarter of float32's bytes):
    the same weights and, on every path, the same outputs bit for bit as the float32 scales
    they stand for (a code or factor read from the wrong group, output or span is off)."""
    kernel_cap(cap)
    bits, group, offsets = factoring
    codes = factored_codes(40, 768, bits, group, offsets, seed=rows)
    factored = QUANTIZED_LINEARS[bits](codes)
    plain = QUANTIZED_LINEARS[bits](replace(codes, factors=None))
    assert factored.scales.dtype == torch.int8 and factored.factors.dtype == torch.float32
    assert factored.factors.shape == (3, 3, 2 if offsets else 1, 16)  # (N/16, K/256, S, 16)
    assert plain.scales.dtype == torch.float32 and plain.factors is None
    assert factored.scales.nbytes + factored.factors.nbytes < plain.scales.nbytes / 2
    assert torch.equal(factored.dequantized(), plain.dequantized())
    x = torch.randn(rows, 768, dtype=torch.bfloat16)
    assert torch.equal(factored.kernel(x), plain.kernel(x))


def test_factored_scales_stay_factored_only_where_every_part_is():
    """A fused projection of K-quant parts keeps int8 scale codes, also where one part's
    offsets are made explicit zeros (Q4_K beside Q6_K); beside a part with plain float scales
    it holds float values."""
    q4_k, q6_k = factored_codes(32, 512, 4, 32, True), factored_codes(16, 512, 8, 16, False)
    mixed = GroupedCodes.stacked([q4_k, q6_k])
    assert mixed.factors.shape == (48, 2, 2) and not mixed.factors[32:, :, 1].any()
    layer = Int8Linear(mixed)
    assert layer.scales.dtype == torch.int8
    plain = Int8Linear(GroupedCodes.stacked([q4_k, replace(q6_k, factors=None)]))
    assert plain.factors is None and torch.equal(plain.dequantized(), layer.dequantized())


def test_scales_that_are_not_multiples_of_their_factors_are_refused():
    codes = factored_codes(16, 256, 4, 32, True)
    with pytest.raises(ValueError, match="int8 multiples of their factors"):
        Int4Linear(replace(codes, scales=codes.scales + 1e-3))
    with pytest.raises(ValueError, match=r"factors must be \(N, F, 2\)"):
        replace(codes, factors=codes.factors[..., :1])


@pytest.mark.parametrize("cap", kernels.distinct_caps())
@pytest.mark.parametrize("group", [64, 16, 8, 12])  # x's codes per 32, 16, 8, 4 inputs
def test_int8_kernel_paths_agree_bit_for_bit(kernel_cap, cap, group):
    """Every int8 path (VNNI, plain AVX-512, AVX2 and the generic loop) rounds x to the same
    codes (in vectors of 16 or 8 where its sub-groups allow, else in a plain loop) and does the
    same integer sums and float operations in the same order: the same floats, so a stream moved
    between CPUs keeps its tokens."""
    codes = grouped_codes(50, 192, 8, group, offsets=True, half=False, seed=3)
    layer = Int8Linear(codes)
    x = torch.randn(9, 192, dtype=torch.bfloat16)
    kernel_cap(cap)
    got = layer.kernel(x)
    kernel_cap("generic")
    assert torch.equal(layer.kernel(x), got)


@pytest.mark.parametrize("x_bits", [15, 8])
@pytest.mark.parametrize("grouping", [g for g in GROUPINGS if g[0] == 4])
def test_int4_code_kernels_agree_bit_for_bit(kernel_cap, grouping, x_bits):
    """The int4 kernels that read x's codes (AVX512-VNNI, plain AVX-512, AVX2) do the same
    integer sums and float operations, with codes of 15 bits or of 8: the same floats on every
    kind of CPU."""
    readers = []
    for cap in kernels.distinct_caps():
        kernel_cap(cap)
        if torch.ops.snapstream.int4_matmul_reads_codes(grouping[1]):
            readers.append(cap)
    if len(readers) < 2:
        pytest.skip(f"one int4 kernel on this CPU reads codes ({readers})")
    bits, group, offsets, half = grouping
    layer = Int4Linear(grouped_codes(40, 192, bits, group, offsets, half, seed=5))
    layer.x_bits = x_bits
    x = torch.randn(6, 192, dtype=torch.bfloat16)
    outputs = []
    for cap in readers:
        kernel_cap(cap)
        outputs.append(layer.kernel(x))
    assert all(torch.equal(out, outputs[0]) for out in outputs[1:])


@pytest.mark.parametrize("cap", kernels.distinct_caps())
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_int4_kernel_sums_the_largest_codes_exactly(kernel_cap, cap, sign):
    """Codes 15 times inputs of one magnitude (codes +-16383, high bytes 127 or -128): the int4
    kernels' sums at their largest (a kernel reading codes adds 16 products of up to 15 * 128 =
    1,920 in a 16-bit lane before widening it, 30,720 < 2^15; a wrapped sum would be off by
    2^16)."""
    kernel_cap(cap)
    k = 128
    codes = GroupedCodes(torch.full((16, k), 15, dtype=torch.uint8), torch.ones(16, k // 32),
                         None, 4)
    x = torch.full((3, k), sign, dtype=torch.bfloat16)
    assert torch.equal(Int4Linear(codes).kernel(x), torch.full((3, 16), sign * 15 * k))


def test_int8_kernel_takes_a_zero_row():
    layer = Int8Linear(grouped_codes(16, 64, 8, 32, offsets=False, half=True))
    assert torch.equal(layer.kernel(torch.zeros(2, 64, dtype=torch.bfloat16)), torch.zeros(2, 16))


def test_int8_weights_need_inputs_in_fours():
    with pytest.raises(ValueError, match="divisible by 4"):
        Int8Linear(grouped_codes(16, 66, 8, 66, offsets=False, half=True))


@pytest.mark.parametrize("layer_type", [Int8Linear, Int4Linear])
def test_dequantized_weight_is_the_quantized_float_weight(layer_type):
    linear = spread_linear(40, 64)
    layer = layer_type.from_linear(linear)
    codes = layer_type.requantize(linear.weight)
    groups = codes.scales.shape[1]
    want = codes.codes.view(40, groups, -1).float() * codes.scales[..., None]
    if codes.offsets is not None:
        want = want + codes.offsets[..., None]
    assert torch.equal(layer.dequantized(), want.view(40, 64))


def test_quantized_kernels_reject_a_mismatched_weight():
    layer = Int4Linear.from_linear(spread_linear(32, 64))
    with pytest.raises(RuntimeError, match="do not fill"):
        torch.ops.snapstream.int4_matmul(torch.zeros(1, 64, dtype=torch.bfloat16), layer.weight,
                                         layer.scales, 48)
    with pytest.raises(RuntimeError, match="int4 weight must be"):
        torch.ops.snapstream.int4_matmul(torch.zeros(1, 96, dtype=torch.bfloat16), layer.weight,
                                         layer.scales, 32)


@pytest.mark.parametrize("layer_type", [Int8Linear, Int4Linear])
def test_quantized_kernels_have_shapes_for_torch_compile(layer_type):
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = layer_type.from_linear(spread_linear(40, 64))
    with FakeTensorMode(allow_non_fake_inputs=True):
        out = layer.kernel(torch.empty(3, 64, dtype=torch.bfloat16))
    assert out.shape == (3, 40) and out.dtype == torch.float32


@pytest.mark.parametrize("cap", kernels.distinct_caps())
@pytest.mark.parametrize("layer_type", [Int8Linear, Int4Linear])
def test_a_rows_result_does_not_depend_on_its_batch(kernel_cap, cap, layer_type):
    """Bit for bit: a decode row gets the same logits alone or among 16 others (register tiles
    of 8 rows and a remainder), so a stream resumed on another worker stays token-identical."""
    kernel_cap(cap)
    layer = layer_type.from_linear(spread_linear(48, 96))
    x = torch.randn(17, 96, dtype=torch.bfloat16)
    together = layer.kernel(x)
    for i in (0, 7, 8, 16):
        assert torch.equal(layer.kernel(x[i : i + 1])[0], together[i])
        assert torch.equal(layer.kernel(x[i : i + 3])[0], together[i])


@pytest.mark.parametrize("bits", [4, 8])
def test_a_layer_packed_from_chunks_of_rows_equals_one_packed_whole(bits):
    codes = grouped_codes(70, 64, bits, 32, offsets=True, half=False)
    chunks = [codes.rows(torch.arange(start, min(start + 32, 70))) for start in (0, 32, 64)]
    layer = QUANTIZED_LINEARS[bits].from_chunks(iter(chunks), 70)
    whole = QUANTIZED_LINEARS[bits](codes)
    assert torch.equal(layer.weight, whole.weight) and torch.equal(layer.scales, whole.scales)
    assert torch.equal(layer.dequantized(), whole.dequantized()) and layer.bias is None
    with pytest.raises(ValueError, match="last chunk"):
        QUANTIZED_LINEARS[bits].from_chunks(iter([chunks[2], chunks[0]]), 38)


FAULTS_OF_OPS = """
import resource, sys, torch
from snapstream.memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
x = torch.ones(8 << 20)  # 32 MiB: each op's output is a large block
def faults_of_ops():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        (x * 2 + 1).sum()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_ops()  # the heap grows to what the ops need
print(faults_of_ops())
"""


def _faults_of_ops(setting: str) -> int:
    run = subprocess.run([sys.executable, "-c", FAULTS_OF_OPS, setting], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    return int(run.stdout.split()[-1])


def test_kept_freed_memory_runs_ops_on_large_tensors_without_most_page_faults():
    default = _faults_of_ops("default")
    assert default > 80_000  # 20 outputs of 8k pages, faulted in afresh
    assert _faults_of_ops("keep") < default / 10
