"""The decode step's attention over a slot cache, in float32 and from a bfloat16 cache."""

from __future__ import annotations

import pytest
import torch

from snapstream.attention import slot_attention


def reference(q, k, v, empty) -> torch.Tensor:
    """float64, keys repeated per query head, empty slots dropped: (B, Hq, 1, D)."""
    _, Hq, _, D = q.shape
    group = Hq // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)  # (B, Hq, S, D)
    v64 = v.double().repeat_interleave(group, dim=1)
    scores = (q.double() @ k64.transpose(-1, -2)) / D**0.5  # (B, Hq, 1, S)
    probs = torch.softmax(scores.masked_fill(empty, float("-inf")), dim=-1)
    return probs @ v64


def case(batch: int, num_heads: int, num_kv_heads: int, slots: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, num_heads, 1, 16, generator=generator) * 2
    k = torch.randn(batch, num_kv_heads, slots, 16, generator=generator)
    v = torch.randn(batch, num_kv_heads, slots, 16, generator=generator)
    empty = torch.rand(batch, 1, 1, slots, generator=generator) < 0.3
    empty[..., 0] = False  # every row holds a token
    return q, k, v, empty


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (4, 2), (6, 2), (4, 1)])
def test_float32_cache_matches_reference(num_heads, num_kv_heads):
    q, k, v, empty = case(3, num_heads, num_kv_heads, slots=40)
    got = slot_attention(q, k, v, empty)
    assert got.shape == q.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference(q, k, v, empty), atol=1e-5, rtol=0)


def test_bfloat16_cache_tracks_reference_of_its_own_values():
    q, k, v, empty = case(2, 6, 2, slots=64, seed=1)
    k16, v16 = k.to(torch.bfloat16), v.to(torch.bfloat16)
    got = slot_attention(q, k16, v16, empty)
    assert got.dtype == torch.float32  # the activations' dtype, whatever the cache's
    want = reference(q, k16, v16, empty)
    # bfloat16 scores and probabilities: ~1% of the output's scale; a wrong mask or head
    # mapping is off by the output's whole scale
    assert float((got.double() - want).abs().max()) < 0.02 * float(want.abs().max())


def test_empty_slots_never_contribute():
    q, k, v, empty = case(2, 4, 2, slots=24, seed=2)
    poisoned_k, poisoned_v = k.clone(), v.clone()
    mask = empty[:, 0, 0]  # (B, S)
    poisoned_k.transpose(1, 2)[mask] = 1e4
    poisoned_v.transpose(1, 2)[mask] = 1e4
    torch.testing.assert_close(slot_attention(q, poisoned_k, poisoned_v, empty),
                               slot_attention(q, k, v, empty), atol=1e-5, rtol=0)
