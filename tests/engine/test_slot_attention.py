"""The project's torch ops (snapstream.kernels): the decode step's write-then-attend over a slot
cache, as the compiled CPU kernel and as the grouped matmuls other devices run, in float32 and
from a bfloat16 cache, against float64 references."""

from __future__ import annotations

import pytest
import torch

from snapstream import kernels
from snapstream.attention import slot_attention
from snapstream.kvquant import kv_codec, kv_float


def reference(q, k, v, empty) -> torch.Tensor:
    """float64, keys repeated per query head, empty slots dropped: (B, Hq, 1, D)."""
    _, Hq, _, D = q.shape
    group = Hq // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)  # (B, Hq, S, D)
    v64 = v.double().repeat_interleave(group, dim=1)
    scores = (q.double() @ k64.transpose(-1, -2)) / D**0.5  # (B, Hq, 1, S)
    probs = torch.softmax(scores.masked_fill(empty[:, None, None], float("-inf")), dim=-1)
    return probs @ v64


def expected_after_write(q, k_new, v_new, k, v, written, empty):
    """The cache (in any KV dtype) with each row's new key and value encoded by its
    snapstream.kvquant codec into the row's slot, and the float64 reference over its values
    -> (reference, k, v)."""
    codec = kv_codec(k.dtype)
    k, v = k.clone(), v.clone()
    rows = torch.arange(len(written))
    k[rows, :, written] = codec.encode(k_new[:, :, 0])
    v[rows, :, written] = codec.encode(v_new[:, :, 0])
    return reference(q, kv_float(k), kv_float(v), empty), k, v


def case(batch: int, num_heads: int, num_kv_heads: int, slots: int, dim: int = 16,
         seed: int = 0, dtype: torch.dtype = torch.float32):
    """q, the new keys and values (B, H*, 1, D), a cache (B, Hkv, S, D) in ``dtype``, the slot
    each row writes and which slots are empty (never the written one)."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, num_heads, 1, dim, generator=generator) * 2
    k_new = torch.randn(batch, num_kv_heads, 1, dim, generator=generator)
    v_new = torch.randn(batch, num_kv_heads, 1, dim, generator=generator)
    k = torch.randn(batch, num_kv_heads, slots, dim, generator=generator).to(dtype)
    v = torch.randn(batch, num_kv_heads, slots, dim, generator=generator).to(dtype)
    written = torch.randint(0, slots, (batch,), generator=generator)
    empty = torch.rand(batch, slots, generator=generator) < 0.3
    empty[torch.arange(batch), written] = False
    return q, k_new, v_new, k, v, written, empty


def grouped(q, k, v, k_new, v_new, slots, empty):
    out = kernels.grouped_slot_attention(q[:, :, 0], k, v, k_new[:, :, 0], v_new[:, :, 0],
                                         slots, empty)
    return out[:, :, None]


def expected(q, k_new, v_new, k, v, written, empty):
    """The reference over the cache with the new keys and values written by hand."""
    k, v = k.clone(), v.clone()
    rows = torch.arange(len(written))
    k[rows, :, written] = k_new[:, :, 0].to(k.dtype)
    v[rows, :, written] = v_new[:, :, 0].to(v.dtype)
    return reference(q, k, v, empty), k, v


SHAPES = [(3, 4, 4, 40), (3, 4, 2, 40), (2, 6, 2, 300), (1, 9, 3, 1024), (5, 4, 1, 513)]
ATTENDS = [pytest.param(slot_attention, id="kernel"), pytest.param(grouped, id="grouped")]


@pytest.mark.parametrize("attend", ATTENDS)
@pytest.mark.parametrize(("batch", "num_heads", "num_kv_heads", "slots"), SHAPES)
def test_float32_cache_writes_then_matches_reference(attend, batch, num_heads, num_kv_heads,
                                                    slots):
    q, k_new, v_new, k, v, written, empty = case(batch, num_heads, num_kv_heads, slots)
    want, k_after, v_after = expected(q, k_new, v_new, k, v, written, empty)
    got = attend(q, k, v, k_new, v_new, written, empty)
    assert got.shape == q.shape and got.dtype == torch.float32
    assert torch.equal(k, k_after) and torch.equal(v, v_after)  # written in place, nowhere else
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cap", kernels.distinct_caps())  # each path the CPU has, to plain C++
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slots", [3, 30, 64, 270, 512])  # against tiles of 4, 16 and 256 slots
@pytest.mark.parametrize("group", [1, 2, 4, 8])  # query heads per KV head
@pytest.mark.parametrize("dim", [8, 16, 64, 256])
def test_kernel_matches_reference_for_every_tiling(kernel_cap, dim, group, slots, dtype,
                                                   cap):
    """Every head dimension, GQA group and number of slots, either code path: a score written
    past its query head's row or a slot dropped at a tile's edge is off by far more than 1e-5."""
    kernel_cap(cap)
    q, k_new, v_new, k, v, written, empty = case(2, 2 * group, 2, slots, dim=dim,
                                                 seed=dim + slots, dtype=dtype)
    want, _, _ = expected(q, k_new, v_new, k, v, written, empty)
    got = slot_attention(q, k, v, k_new, v_new, written, empty)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("batch", "num_heads", "num_kv_heads", "slots"), SHAPES)
def test_kernel_reads_a_bfloat16_cache_in_float32_arithmetic(batch, num_heads, num_kv_heads,
                                                            slots):
    q, k_new, v_new, k, v, written, empty = case(batch, num_heads, num_kv_heads, slots, dim=64,
                                                 seed=1, dtype=torch.bfloat16)
    want, k_after, v_after = expected(q, k_new, v_new, k, v, written, empty)
    got = slot_attention(q, k, v, k_new, v_new, written, empty)
    assert got.dtype == torch.float32  # the activations' dtype, whatever the cache's
    assert torch.equal(k, k_after) and torch.equal(v, v_after)  # rounded as .to(bfloat16)
    # the cache's own values, exactly: only float32 rounding is left
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


def test_grouped_matmuls_track_a_bfloat16_cache():
    q, k_new, v_new, k, v, written, empty = case(2, 6, 2, 64, seed=1, dtype=torch.bfloat16)
    want, _, _ = expected(q, k_new, v_new, k, v, written, empty)
    # bfloat16 scores and probabilities: ~1% of the output's scale; a wrong mask or head
    # mapping is off by the output's whole scale
    error = (grouped(q, k, v, k_new, v_new, written, empty).double() - want).abs().max()
    assert float(error) < 0.02 * float(want.abs().max())


@pytest.mark.parametrize("attend", ATTENDS)
def test_empty_slots_never_contribute(attend):
    q, k_new, v_new, k, v, written, empty = case(2, 4, 2, 300, seed=2)
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k.transpose(1, 2)[empty] = 1e4
    poisoned_v.transpose(1, 2)[empty] = -1e4
    torch.testing.assert_close(attend(q, poisoned_k, poisoned_v, k_new, v_new, written, empty),
                               attend(q, k, v, k_new, v_new, written, empty), atol=1e-5, rtol=0)


def test_kernel_refuses_what_it_cannot_compute():
    q, k_new, v_new, k, v, written, empty = case(2, 4, 2, 8)
    with pytest.raises(RuntimeError, match="float32, bfloat16, int8 or float8_e4m3fn"):
        slot_attention(q, k.half(), v.half(), k_new, v_new, written, empty)
    with pytest.raises(RuntimeError, match="empty does not match"):
        slot_attention(q, k, v, k_new, v_new, written, empty[:, :4])
    with pytest.raises(RuntimeError, match="outside"):
        slot_attention(q, k, v, k_new, v_new, torch.tensor([0, 8]), empty)
    with pytest.raises(RuntimeError, match="contiguous"):
        slot_attention(q, k.transpose(2, 3), v.transpose(2, 3), k_new, v_new, written, empty)
