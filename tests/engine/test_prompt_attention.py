"""The prompt's causal attention: snapstream's flash kernel (kernels.prompt_attention, float32 on
AVX-512 CPUs, bfloat16 on AVX512-BF16 CPUs without AMX) against a float64 reference at the
shapes of both model families, across its blocks (64-key panels, 256-key softmax steps,
32-position work items, 6-row tiles) and within sliding windows of positions; and
attention.causal_attention, which runs it where ``prompt_attention_covers`` says so and torch's SDPA
elsewhere."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from snapstream import kernels
from snapstream.attention import causal_attention
from snapstream.cpu import cpu_flags


def reference(q, k, v, window=None, positions=None) -> torch.Tensor:
    """float64, keys repeated per query head, an explicit (T, T) mask: (B, Hq, T, D)."""
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)  # (B, Hq, T, D)
    v64 = v.double().repeat_interleave(group, dim=1)
    scores = q.double() @ k64.transpose(-1, -2) / q.shape[-1] ** 0.5  # (B, Hq, T, T)
    at = torch.arange(q.shape[2]) if positions is None else positions
    visible = at[None] <= at[:, None]  # (T, T): keys up to the query's own
    if window is not None:
        visible &= at[None] > at[:, None] - window
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v64


def case(batch, q_heads, kv_heads, tokens, dim, seed=0, dtype=torch.float32, q_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_heads, tokens, dim, generator=gen) * q_scale
    k = torch.randn(batch, kv_heads, tokens, dim, generator=gen)
    v = torch.randn(batch, kv_heads, tokens, dim, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def kept_positions(tokens: int, span: int, seed: int = 0) -> torch.Tensor:
    """``tokens`` ascending positions out of 0..span-1 (the kept part of a longer prompt)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(span, generator=gen)[:tokens].sort().values


needs_kernel = pytest.mark.skipif(
    not kernels.prompt_attention_covers(torch.empty(1, 1, 1, 64)),
    reason="the prompt attention kernel needs an AVX-512 CPU")
needs_bf16_kernel = pytest.mark.skipif(
    not kernels.prompt_attention_covers(torch.empty(1, 1, 1, 64, dtype=torch.bfloat16)),
    reason="the bfloat16 prompt attention kernel needs an AVX512-BF16 CPU without AMX")

# bfloat16 in, bfloat16 out: the output's rounding (2^-9 relative) and the probabilities'
# (rounded to bfloat16 for P V, as torch's flash SDPA does) against the float64 reference of
# the same bfloat16 inputs; the mean error bounds what a wrong block or mask would leave.
BF16_TOL = {"atol": 1.6e-2, "rtol": 1.6e-2}
BF16_MEAN_ERROR = 1e-3


def assert_bf16_close(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, **BF16_TOL)
    assert float((out.double() - expected).abs().mean()) < BF16_MEAN_ERROR

# (B, Hq, Hkv, T, D): SmolLM2's 9/3 heads of 64, Gemma 3 270M's 4/1 of 256, plain multi-head,
# a batch of two; T from one token to several key blocks, on and off every block edge.
SHAPES = [
    (1, 9, 3, 1, 64), (1, 9, 3, 7, 64), (1, 9, 3, 64, 64), (1, 9, 3, 65, 64),
    (1, 9, 3, 257, 64), (1, 9, 3, 600, 64), (1, 4, 1, 333, 256), (2, 4, 4, 97, 64),
    (1, 6, 2, 1100, 128),
]


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_kernel_matches_the_float64_reference(shape):
    q, k, v = case(*shape)
    out = kernels.prompt_attention(q, k, v)
    assert out.shape == q.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference(q, k, v), atol=1e-5, rtol=1e-5)


@needs_bf16_kernel
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_bfloat16_kernel_matches_the_float64_reference(shape):
    q, k, v = case(*shape, dtype=torch.bfloat16)
    out = kernels.prompt_attention(q, k, v)
    assert out.shape == q.shape
    assert_bf16_close(out, reference(q, k, v))


@needs_bf16_kernel
def test_the_bfloat16_kernel_is_as_close_as_torchs_sdpa():
    """Its error against float64 is that of torch's bfloat16 flash SDPA on the same inputs."""
    q, k, v = case(1, 9, 3, 1100, 64, seed=5, dtype=torch.bfloat16)
    expected = reference(q, k, v)
    ours = (kernels.prompt_attention(q, k, v).double() - expected).abs()
    sdpa = (F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).double()
            - expected).abs()
    assert float(ours.mean()) <= 1.1 * float(sdpa.mean())
    assert float(ours.max()) <= 1.5 * float(sdpa.max())


def test_bfloat16_is_covered_exactly_on_cpus_with_avx512_bf16_and_no_amx(kernel_cap):
    kernel_cap("native")
    flags = cpu_flags()
    expected = "avx512_bf16" in flags and "amx_bf16" not in flags
    assert kernels.prompt_attention_covers(torch.empty(1, 9, 10, 64, dtype=torch.bfloat16)) \
        == expected


# (Hq, Hkv, T, D, window, span of the kept positions or None): windows shorter than a block,
# than a key block, longer than the prompt; Gemma 3's 512 at its head shape; kept positions.
WINDOWS = [
    (9, 3, 300, 64, 16, None), (9, 3, 1100, 64, 100, None), (9, 3, 600, 64, 512, None),
    (4, 1, 700, 256, 512, None), (9, 3, 200, 64, 512, None), (9, 3, 400, 64, 64, 1000),
    (4, 1, 500, 256, 300, 2000),
]


@needs_kernel
@pytest.mark.parametrize("shape", WINDOWS, ids=lambda s: "x".join(map(str, s)))
def test_the_kernel_keeps_each_query_within_its_window(shape):
    q_heads, kv_heads, tokens, dim, window, span = shape
    q, k, v = case(1, q_heads, kv_heads, tokens, dim, seed=3)
    positions = None if span is None else kept_positions(tokens, span)
    out = kernels.prompt_attention(q, k, v, window, positions)
    torch.testing.assert_close(out.double(), reference(q, k, v, window, positions),
                               atol=1e-5, rtol=1e-5)


@needs_bf16_kernel
@pytest.mark.parametrize("shape", WINDOWS, ids=lambda s: "x".join(map(str, s)))
def test_the_bfloat16_kernel_keeps_each_query_within_its_window(shape):
    q_heads, kv_heads, tokens, dim, window, span = shape
    q, k, v = case(1, q_heads, kv_heads, tokens, dim, seed=3, dtype=torch.bfloat16)
    positions = None if span is None else kept_positions(tokens, span)
    assert_bf16_close(kernels.prompt_attention(q, k, v, window, positions),
                      reference(q, k, v, window, positions))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32,
                                   pytest.param(torch.bfloat16, marks=needs_bf16_kernel)],
                         ids=["float32", "bfloat16"])
def test_peaked_scores_keep_the_softmax_stable(dtype):
    """Scores in the hundreds: the running max (kept as the scores leave the registers, masked
    keys excluded) and the rescaling of earlier blocks must hold."""
    q, k, v = case(1, 9, 3, 700, 64, seed=1, dtype=dtype, q_scale=40.0)
    out = kernels.prompt_attention(q, k, v, 200)
    assert torch.isfinite(out).all()
    if dtype == torch.bfloat16:
        assert_bf16_close(out, reference(q, k, v, 200))
    else:
        torch.testing.assert_close(out.double(), reference(q, k, v, 200), atol=1e-4, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32,
                                   pytest.param(torch.bfloat16, marks=needs_bf16_kernel)],
                         ids=["float32", "bfloat16"])
def test_strided_views_read_as_their_values(dtype):
    """The model hands q, k, v over as (B, T, H, D) -> (B, H, T, D) views."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 300, 9, 64, generator=gen).to(dtype).transpose(1, 2)
    k = torch.randn(1, 300, 3, 64, generator=gen).to(dtype).transpose(1, 2)
    v = torch.randn(1, 300, 3, 64, generator=gen).to(dtype).transpose(1, 2)
    contiguous = kernels.prompt_attention(q.contiguous(), k.contiguous(), v.contiguous())
    assert torch.equal(kernels.prompt_attention(q, k, v), contiguous)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("cap", kernels.distinct_caps())
@pytest.mark.parametrize(("window", "span"), [(None, None), (100, None), (64, 1000)],
                         ids=["causal", "window", "window_kept_positions"])
def test_causal_attention_matches_the_reference_on_either_path(kernel_cap, cap, window, span,
                                                               dtype):
    """The kernel where it covers, torch's SDPA (a window block by block) under the generic
    cap or on CPUs it does not cover."""
    kernel_cap(cap)
    q, k, v = case(1, 9, 3, 400, 64, seed=4, dtype=dtype)
    positions = None if span is None else kept_positions(400, span, seed=1)
    out, expected = causal_attention(q, k, v, window, positions), reference(q, k, v, window,
                                                                            positions)
    if dtype == torch.bfloat16:
        assert_bf16_close(out, expected)
    else:
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("dim", "dtype"), [(64, torch.float16), (32, torch.float32)],
                         ids=["float16", "head_dim_32"])
def test_what_the_kernel_does_not_cover_runs_torchs_sdpa(dim, dtype):
    q, k, v = case(1, 9, 3, 200, dim, dtype=dtype)
    assert not kernels.prompt_attention_covers(q)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(causal_attention(q, k, v), expected)
    with pytest.raises(RuntimeError, match="prompt_attention_covers"):
        kernels.prompt_attention(q, k, v)


def test_the_generic_cap_turns_the_kernel_off(kernel_cap):
    kernel_cap("generic")
    for dtype in (torch.float32, torch.bfloat16):
        assert not kernels.prompt_attention_covers(torch.empty(1, 9, 10, 64, dtype=dtype))


@needs_kernel
@pytest.mark.parametrize(("kv_shape", "window", "positions", "message"), [
    ((1, 4, 10, 64), 0, None, "does not match"),
    ((1, 3, 11, 64), 0, None, "does not match"),
    ((3, 10, 64), 0, None, "want q"),
    ((1, 3, 10, 64), -1, None, "window must be >= 0"),
    ((1, 3, 10, 64), 4, torch.arange(9), "want positions"),
    ((1, 3, 10, 64), 4, torch.arange(10, dtype=torch.int32), "want positions"),
])
def test_mismatched_inputs_are_refused(kv_shape, window, positions, message):
    q = torch.randn(1, 9, 10, 64)
    k, v = torch.randn(kv_shape), torch.randn(kv_shape)
    with pytest.raises(RuntimeError, match=message):
        kernels.prompt_attention(q, k, v, window, positions)


@pytest.mark.parametrize("outputs", [1, 7])
@pytest.mark.parametrize(("window", "span"), [(None, None), (100, None), (64, 1000)],
                         ids=["causal", "window", "window_kept_positions"])
def test_the_last_queries_alone_get_the_full_results_last_rows(window, span, outputs):
    q, k, v = case(2, 9, 3, 400, 64, seed=5)
    positions = None if span is None else kept_positions(400, span, seed=2)
    out = causal_attention(q, k, v, window, positions, outputs)
    assert out.shape == (2, 9, outputs, 64)
    expected = reference(q, k, v, window, positions)[:, :, -outputs:]
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
