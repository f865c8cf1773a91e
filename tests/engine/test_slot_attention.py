"""The decode step's attention over a slot cache: the compiled CPU kernel and the grouped
matmuls other devices run, in float32 and from a bfloat16 cache, against a float64 reference."""

from __future__ import annotations

import pytest
import torch

from snapstream.attention import grouped_slot_attention, slot_attention


def reference(q, k, v, empty) -> torch.Tensor:
    """float64, keys repeated per query head, empty slots dropped: (B, Hq, 1, D)."""
    _, Hq, _, D = q.shape
    group = Hq // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)  # (B, Hq, S, D)
    v64 = v.double().repeat_interleave(group, dim=1)
    scores = (q.double() @ k64.transpose(-1, -2)) / D**0.5  # (B, Hq, 1, S)
    probs = torch.softmax(scores.masked_fill(empty[:, None, None], float("-inf")), dim=-1)
    return probs @ v64


def case(batch: int, num_heads: int, num_kv_heads: int, slots: int, dim: int = 16,
         seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, num_heads, 1, dim, generator=generator) * 2
    k = torch.randn(batch, num_kv_heads, slots, dim, generator=generator)
    v = torch.randn(batch, num_kv_heads, slots, dim, generator=generator)
    empty = torch.rand(batch, slots, generator=generator) < 0.3
    empty[:, 0] = False  # every row holds a token
    return q, k, v, empty


def grouped(q, k, v, empty):
    return grouped_slot_attention(q[:, :, 0], k, v, empty)[:, :, None]


SHAPES = [(3, 4, 4, 40), (3, 4, 2, 40), (2, 6, 2, 300), (1, 9, 3, 1024), (5, 4, 1, 513)]


@pytest.mark.parametrize("attend", [slot_attention, grouped], ids=["kernel", "grouped"])
@pytest.mark.parametrize(("batch", "num_heads", "num_kv_heads", "slots"), SHAPES)
def test_float32_cache_matches_reference(attend, batch, num_heads, num_kv_heads, slots):
    q, k, v, empty = case(batch, num_heads, num_kv_heads, slots)
    got = attend(q, k, v, empty)
    assert got.shape == q.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference(q, k, v, empty), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("batch", "num_heads", "num_kv_heads", "slots"), SHAPES)
def test_kernel_reads_a_bfloat16_cache_in_float32_arithmetic(batch, num_heads, num_kv_heads,
                                                            slots):
    q, k, v, empty = case(batch, num_heads, num_kv_heads, slots, dim=64, seed=1)
    k16, v16 = k.to(torch.bfloat16), v.to(torch.bfloat16)
    got = slot_attention(q, k16, v16, empty)
    assert got.dtype == torch.float32  # the activations' dtype, whatever the cache's
    # the cache's own values, exactly: only float32 rounding is left
    torch.testing.assert_close(got.double(), reference(q, k16, v16, empty), atol=1e-5, rtol=0)


def test_grouped_matmuls_track_a_bfloat16_cache():
    q, k, v, empty = case(2, 6, 2, slots=64, seed=1)
    k16, v16 = k.to(torch.bfloat16), v.to(torch.bfloat16)
    want = reference(q, k16, v16, empty)
    # bfloat16 scores and probabilities: ~1% of the output's scale; a wrong mask or head
    # mapping is off by the output's whole scale
    error = (grouped(q, k16, v16, empty).double() - want).abs().max()
    assert float(error) < 0.02 * float(want.abs().max())


@pytest.mark.parametrize("attend", [slot_attention, grouped], ids=["kernel", "grouped"])
def test_empty_slots_never_contribute(attend):
    q, k, v, empty = case(2, 4, 2, slots=300, seed=2)
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k.transpose(1, 2)[empty] = 1e4
    poisoned_v.transpose(1, 2)[empty] = -1e4
    torch.testing.assert_close(attend(q, poisoned_k, poisoned_v, empty),
                               attend(q, k, v, empty), atol=1e-5, rtol=0)


def test_kernel_refuses_what_it_cannot_compute():
    q, k, v, empty = case(2, 4, 2, slots=8)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        slot_attention(q, k.half(), v.half(), empty)
    with pytest.raises(RuntimeError, match="empty does not match"):
        slot_attention(q, k, v, empty[:, :4])
