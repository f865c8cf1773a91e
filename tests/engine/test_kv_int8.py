"""The int8 KV cache (snapstream.kvquant): the quantizer's error bound, the decode kernel's int8
path (its write and its attention) against a torch reference, and an int8 engine against a
float one on a tiny model."""

from __future__ import annotations

import pytest
import torch

from snapstream import kernels
from snapstream.attention import slot_attention
from snapstream.engine import Engine
from snapstream.kvcache import BatchCache
from snapstream.kvquant import KV_CODECS, SCALE_BYTES, Int8KV, _int8_rows_elsewhere
from snapstream.policy import CachePolicy
from snapstream.weight_formats import KV_DTYPES
from tests.engine.helpers import engine_for, greedy_with_logits
from tests.engine.test_slot_attention import expected_after_write
from tests.tiny_models import random_model, tiny_config

INT8 = Int8KV()


def test_every_served_kv_dtype_has_a_codec():
    assert {getattr(torch, name) for name in KV_DTYPES} <= set(KV_CODECS)


@pytest.mark.parametrize("spread", [1e-3, 1.0, 300.0])
def test_round_trip_error_is_at_most_half_a_step(spread):
    """Each value comes back within half its row's step (absmax / 127); the row's largest value
    exactly (its code is +-127); an all-zero row as zeros; re-quantizing gives the same bytes."""
    x = torch.randn(500, 64, generator=torch.Generator().manual_seed(0)) * spread
    x[7] = 0.0
    rows = INT8.encode(x)  # (500, 68)
    assert rows.dtype == torch.int8 and rows.shape == (500, 64 + SCALE_BYTES)
    scale = rows[:, -SCALE_BYTES:].contiguous().view(torch.float32)  # (500, 1)
    torch.testing.assert_close(scale[:, 0], x.abs().amax(-1) / 127)
    back = INT8.decode(rows)
    assert bool(((back - x).abs() <= scale / 2 * (1 + 1e-5)).all())
    assert torch.equal(back[7], torch.zeros(64))
    assert bool((rows[:, :-SCALE_BYTES].abs().amax(-1)[x.abs().amax(-1) > 0] == 127).all())
    assert torch.equal(INT8.encode(back), rows)


def rows_with_ties(dim: int, dtype: torch.dtype) -> torch.Tensor:
    """(40, dim) rows of ``dtype`` across spreads, an all-zero row, a row whose values divide
    by its scale to exact halves (ties, rounded to even) and a row of tiny values."""
    generator = torch.Generator().manual_seed(dim)
    spread = torch.logspace(-4, 4, 40, dtype=torch.float64)[:, None]
    x = (torch.randn(40, dim, generator=generator, dtype=torch.float64) * spread).to(dtype)
    x[3] = 0
    x[5] = (torch.arange(dim) % 16 - 8) * 0.5 + 0.25  # odd quarters
    x[5, 0] = 63.5  # absmax 63.5: scale 0.5, so x / scale = k + 0.5
    x[7] = -1e-30
    return x


@pytest.mark.parametrize("cap", kernels.distinct_caps())  # each path the CPU has, to plain C++
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("dim", [1, 8, 15, 16, 20, 64, 100, 256])  # tails of 16 lanes
def test_the_cpu_rows_are_the_torch_formulas_bytes(kernel_cap, dim, dtype, cap):
    """The CPU op (one pass per row, shared with the decode kernel's writes) gives the bytes of
    the torch formula used off the CPU: the same scale, the same ties rounded to even."""
    kernel_cap(cap)
    x = rows_with_ties(dim, dtype)
    got = torch.ops.snapstream.int8_rows(x)
    assert got.shape == (40, dim + SCALE_BYTES) and got.dtype == torch.int8
    assert torch.equal(got, _int8_rows_elsewhere(x))
    strided = torch.ops.snapstream.int8_rows(x.t().contiguous().t())  # same rows, column-major
    assert torch.equal(strided, got)


def test_int8_rows_refuses_what_it_cannot_quantize():
    with pytest.raises(RuntimeError, match="floating-point CPU tensor"):
        torch.ops.snapstream.int8_rows(torch.ones(4, 8, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="D > 0"):
        torch.ops.snapstream.int8_rows(torch.ones(4, 0))
    assert torch.ops.snapstream.int8_rows(torch.ones(0, 8)).shape == (0, 8 + SCALE_BYTES)


def int8_case(batch: int, num_heads: int, num_kv_heads: int, slots: int, dim: int, seed: int):
    """q, new keys and values (B, H*, 1, D) float32, an int8 cache (B, Hkv, S, D + 4) of
    keys and values of different spreads per slot, each row's slot and the empty slots."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, num_heads, 1, dim, generator=generator) * 2
    k_new = torch.randn(batch, num_kv_heads, 1, dim, generator=generator)
    v_new = torch.randn(batch, num_kv_heads, 1, dim, generator=generator)
    spread = torch.rand(batch, num_kv_heads, slots, 1, generator=generator) * 3 + 0.1
    k = INT8.encode(torch.randn(batch, num_kv_heads, slots, dim, generator=generator) * spread)
    v = INT8.encode(torch.randn(batch, num_kv_heads, slots, dim, generator=generator) * spread)
    written = torch.randint(0, slots, (batch,), generator=generator)
    empty = torch.rand(batch, slots, generator=generator) < 0.3
    empty[torch.arange(batch), written] = False
    return q, k_new, v_new, k, v, written, empty


@pytest.mark.parametrize("cap", kernels.distinct_caps())  # each path the CPU has, to plain C++
@pytest.mark.parametrize("slots", [3, 30, 64, 270, 512])  # against tiles of 4, 16 and 256 slots
@pytest.mark.parametrize("group", [1, 2, 4, 8])  # query heads per KV head
@pytest.mark.parametrize("dim", [8, 16, 64, 256])
def test_kernel_int8_path_matches_reference_for_every_tiling(kernel_cap, dim, group, slots,
                                                             cap):
    """The kernel writes the step's rows byte for byte as kvquant quantizes them and attends
    over the dequantized cache within float32 rounding: a scale applied to the wrong slot, or
    a row read at the float stride, is off by far more than 1e-5."""
    kernel_cap(cap)
    q, k_new, v_new, k, v, written, empty = int8_case(2, 2 * group, 2, slots, dim,
                                                      seed=dim + slots + group)
    want, k_after, v_after = expected_after_write(q, k_new, v_new, k, v, written, empty)
    got = slot_attention(q, k, v, k_new, v_new, written, empty)
    assert torch.equal(k, k_after) and torch.equal(v, v_after)
    # values reach ~4 here (slots of spread up to 3): float32 rounding relative to them
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_kernel_quantizes_a_bfloat16_step_as_kvquant_does():
    q, k_new, v_new, k, v, written, empty = int8_case(3, 6, 2, 40, 64, seed=5)
    k_new, v_new = k_new.bfloat16(), v_new.bfloat16()
    _, k_after, v_after = expected_after_write(q, k_new, v_new, k, v, written, empty)
    slot_attention(q, k, v, k_new, v_new, written, empty)
    assert torch.equal(k, k_after) and torch.equal(v, v_after)


def test_grouped_matmuls_read_an_int8_cache():
    """The op off the CPU: the same write, float32 arithmetic over the dequantized cache."""
    q, k_new, v_new, k, v, written, empty = int8_case(2, 6, 2, 64, 16, seed=1)
    want, k_after, v_after = expected_after_write(q, k_new, v_new, k, v, written, empty)
    got = kernels.grouped_slot_attention(q[:, :, 0], k, v, k_new[:, :, 0], v_new[:, :, 0],
                                         written, empty)
    assert torch.equal(k, k_after) and torch.equal(v, v_after)
    torch.testing.assert_close(got[:, :, None].double(), want, atol=1e-5, rtol=0)


def test_empty_int8_slots_never_contribute():
    q, k_new, v_new, k, v, written, empty = int8_case(2, 4, 2, 300, 64, seed=2)
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k.transpose(1, 2)[empty] = 127  # codes and scale bytes alike: a huge scale
    poisoned_v.transpose(1, 2)[empty] = -127
    torch.testing.assert_close(slot_attention(q, poisoned_k, poisoned_v, k_new, v_new, written,
                                              empty),
                               slot_attention(q, k, v, k_new, v_new, written, empty),
                               atol=1e-5, rtol=0)


def test_a_float_sequence_is_quantized_once_into_an_int8_pool():
    engine = engine_for(random_model(tiny_config()))
    cache = engine.prefill(list(range(50)), CachePolicy(n_sink=4, n_topk=8, n_recent=8,
                                                       observation=4), max_new_tokens=4).cache
    pool = BatchCache(engine.config, cache.layout, batch_size=2, dtype=torch.int8)
    pool.insert(1, cache)
    (part,), (rows,) = cache.groups, pool.groups
    assert torch.equal(rows.k[:, 1], INT8.encode(part.k))
    assert torch.equal(rows.v[:, 1], INT8.encode(part.v))


PROMPTS = [[3, 17, 99, 4, 5], list(range(40, 75)), [7] * 12 + list(range(200, 230))]


@pytest.mark.parametrize("ids", PROMPTS)
def test_int8_decode_tracks_bfloat16_on_a_tiny_model(ids):
    """Against float32, int8 KV moves the logits about as much as bfloat16 KV does (both well
    under the logits' spread) and keeps every greedy token on short prompts."""
    model = random_model(tiny_config(num_heads=6, num_kv_heads=2, head_dim=32), seed=4)
    policy = CachePolicy(n_sink=2, n_topk=10, n_recent=8, observation=4)
    runs = {dtype: greedy_with_logits(engine_for(model, kv_dtype=dtype), ids, policy, 12)
            for dtype in (torch.float32, torch.bfloat16, torch.int8)}
    tokens, logits, _ = runs[torch.float32]
    assert runs[torch.int8][0] == runs[torch.bfloat16][0] == tokens
    spread = float(logits.std())
    for dtype in (torch.bfloat16, torch.int8):
        assert float((runs[dtype][1] - logits).abs().max()) < 0.05 * spread, dtype


def test_engine_takes_a_kv_dtype_by_name(tiny_model_dir):
    assert Engine.from_pretrained(tiny_model_dir, kv_dtype="int8").kv_dtype == torch.int8
    with pytest.raises(ValueError, match=r"kv_dtype must be one of .*'int8'.*got 'int4'"):
        Engine.from_pretrained(tiny_model_dir, kv_dtype="int4")
