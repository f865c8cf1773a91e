"""Causal attention over a bfloat16 prompt: snapstream's AMX kernel (where the CPU has AMX) and
the SDPA it stands in for, against a float32 reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from snapstream import kernels
from snapstream.model import causal_attention


def qkv(tokens: int, heads: int, kv_heads: int, dim: int, batch: int = 1, seed: int = 0):
    """q (B, Hq, T, D), k/v (B, Hkv, T, D) bfloat16, keys with a spread of norms (peaked and
    flat softmax rows)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, tokens, dim, generator=gen) * 2
    k = torch.randn(batch, kv_heads, tokens, dim, generator=gen)
    k = k * torch.rand(batch, kv_heads, tokens, 1, generator=gen) * 2
    v = torch.randn(batch, kv_heads, tokens, dim, generator=gen)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def reference(q, k, v) -> torch.Tensor:
    """Causal attention in float32 over the bfloat16 inputs, K/V repeated to the query heads."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q.float(), k, v, is_causal=True)


# (tokens, Hq, Hkv, D): SmolLM2's heads, Gemma 3's, tails of every block size, one token
SHAPES = [(1, 9, 3, 64), (17, 9, 3, 64), (64, 9, 3, 64), (100, 9, 3, 64), (257, 9, 3, 64),
          (300, 4, 1, 256), (96, 2, 2, 32)]


@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "dim"), SHAPES)
def test_prompt_attention_tracks_float32_causal_attention(tokens, heads, kv_heads, dim):
    q, k, v = qkv(tokens, heads, kv_heads, dim)
    want = reference(q, k, v)
    got = causal_attention(q, k, v)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    # bfloat16 output (8 bits of mantissa) and bfloat16 probabilities: ~1e-2 of values ~1
    assert float((got.float() - want).abs().max()) < 3e-2
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert float((got.float() - want).abs().mean()) <= 2 * float((sdpa.float() - want).abs().mean())


def test_amx_kernel_runs_where_the_cpu_has_amx_batches_rows_and_names_bad_input():
    q, k, v = qkv(130, 6, 2, 64, batch=2, seed=1)
    if not kernels.amx_attention():
        with pytest.raises(RuntimeError, match="AMX"):
            kernels.prompt_attention(q, k, v)
        return
    got = kernels.prompt_attention(q, k, v)
    for row in range(2):  # each batch row alone is the same attention
        alone = kernels.prompt_attention(q[row:row + 1], k[row:row + 1], v[row:row + 1])
        assert torch.equal(got[row:row + 1], alone)
    assert float((got.float() - reference(q, k, v)).abs().max()) < 3e-2
    with pytest.raises(RuntimeError, match="bfloat16 only"):
        kernels.prompt_attention(q.float(), k, v)
    with pytest.raises(RuntimeError, match="multiple of Hkv"):
        kernels.prompt_attention(q[:, :5], k, v)


def test_generic_kernels_leave_the_prompt_to_sdpa(monkeypatch):
    monkeypatch.setenv("SNAPSTREAM_GENERIC_KERNELS", "1")
    assert not kernels.amx_attention()
    q, k, v = qkv(70, 9, 3, 64)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(causal_attention(q, k, v), sdpa)
