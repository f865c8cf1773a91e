"""The prompt's causal attention (kernels.prompt_attention): the flash kernel of float32 prompts
on AVX-512 CPUs against a float64 reference at the shapes of both model families and across
its blocks (64-key panels, 256-key softmax steps, 32-position work items, 6-row tiles), and
torch's SDPA, exactly, for what the kernel does not cover."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from snapstream import kernels


def reference(q, k, v) -> torch.Tensor:
    """float64, keys repeated per query head, explicit causal mask: (B, Hq, T, D)."""
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)  # (B, Hq, T, D)
    v64 = v.double().repeat_interleave(group, dim=1)
    scores = q.double() @ k64.transpose(-1, -2) / q.shape[-1] ** 0.5  # (B, Hq, T, T)
    future = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v64


def case(batch, q_heads, kv_heads, tokens, dim, seed=0, dtype=torch.float32, q_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_heads, tokens, dim, generator=gen) * q_scale
    k = torch.randn(batch, kv_heads, tokens, dim, generator=gen)
    v = torch.randn(batch, kv_heads, tokens, dim, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


# (B, Hq, Hkv, T, D): SmolLM2's 9/3 heads of 64, Gemma 3 270M's 4/1 of 256, plain multi-head,
# a batch of two; T from one token to several key blocks, on and off every block edge.
SHAPES = [
    (1, 9, 3, 1, 64), (1, 9, 3, 7, 64), (1, 9, 3, 64, 64), (1, 9, 3, 65, 64),
    (1, 9, 3, 257, 64), (1, 9, 3, 600, 64), (1, 4, 1, 333, 256), (2, 4, 4, 97, 64),
    (1, 6, 2, 1100, 128),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_the_float64_reference(shape):
    q, k, v = case(*shape)
    out = kernels.prompt_attention(q, k, v)
    assert out.shape == q.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference(q, k, v), atol=1e-5, rtol=1e-5)


def test_peaked_scores_keep_the_softmax_stable():
    """Scores in the hundreds: the running max and the rescaling of earlier blocks must hold."""
    q, k, v = case(1, 9, 3, 700, 64, seed=1, q_scale=40.0)
    out = kernels.prompt_attention(q, k, v)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), reference(q, k, v), atol=1e-4, rtol=1e-4)


def test_strided_views_read_as_their_values():
    """The model hands q, k, v over as (B, T, H, D) -> (B, H, T, D) views."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 300, 9, 64, generator=gen).transpose(1, 2)
    k = torch.randn(1, 300, 3, 64, generator=gen).transpose(1, 2)
    v = torch.randn(1, 300, 3, 64, generator=gen).transpose(1, 2)
    torch.testing.assert_close(kernels.prompt_attention(q, k, v),
                               kernels.prompt_attention(q.contiguous(), k.contiguous(),
                                                        v.contiguous()), atol=0, rtol=0)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize(("dim", "dtype"), [(64, torch.bfloat16), (32, torch.float32)],
                         ids=["bfloat16", "head_dim_32"])
def test_what_the_kernel_does_not_cover_is_torchs_sdpa(dim, dtype):
    q, k, v = case(1, 9, 3, 200, dim, dtype=dtype)
    assert torch.equal(kernels.prompt_attention(q, k, v), sdpa(q, k, v))


def test_generic_kernels_request_runs_torchs_sdpa(monkeypatch):
    q, k, v = case(1, 9, 3, 200, 64)
    monkeypatch.setenv("SNAPSTREAM_GENERIC_KERNELS", "1")
    assert torch.equal(kernels.prompt_attention(q, k, v), sdpa(q, k, v))


@pytest.mark.parametrize(("q_shape", "kv_shape", "dtype", "message"), [
    ((1, 9, 10, 64), (1, 4, 10, 64), torch.float32, "does not match"),
    ((1, 9, 10, 64), (1, 3, 11, 64), torch.float32, "does not match"),
    ((9, 10, 64), (3, 10, 64), torch.float32, "want q"),
    ((1, 9, 10, 64), (1, 3, 10, 64), torch.float64, "one dtype"),
])
def test_mismatched_inputs_are_refused(q_shape, kv_shape, dtype, message):
    q = torch.randn(q_shape)
    k, v = torch.randn(kv_shape, dtype=dtype), torch.randn(kv_shape, dtype=dtype)
    with pytest.raises(RuntimeError, match=message):
        kernels.prompt_attention(q, k, v)
