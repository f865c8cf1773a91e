"""The fp8 e4m3 KV cache (snapstream.kvquant.Float8KV): its Hadamard rotation, rounding and
saturation, the decode kernel's fp8 path (its rotations, its write and its exact widening of
every byte) against a torch reference, the cache moved through pools and blobs as bytes, and an
fp8 engine against a float one."""

from __future__ import annotations

import pytest
import torch

from kvstore.codec import BlobSpec, decode_blob, encode_blob
from kvstore.seal import ClusterSecret, Seal
from snapstream import kernels
from snapstream.attention import slot_attention
from snapstream.engine import Engine
from snapstream.kvcache import BatchCache
from snapstream.kvquant import Float8KV, as_bits, hadamard, kv_slot_bytes
from snapstream.policy import CachePolicy
from tests.engine.helpers import engine_for, greedy_with_logits
from tests.engine.test_slot_attention import expected_after_write
from tests.tiny_models import random_model, tiny_config

FP8 = Float8KV()
FP8_MAX = 448.0
POLICY = CachePolicy(n_sink=4, n_topk=8, n_recent=8, observation=4)


def every_finite_value() -> torch.Tensor:
    """The 254 finite fp8 e4m3 values (every byte but the two NaNs), subnormals included."""
    codes = torch.arange(256, dtype=torch.int16).to(torch.uint8)
    return codes[(codes & 0x7F) != 0x7F].view(torch.float8_e4m3fn)


def test_hadamard_is_orthogonal_and_its_own_inverse():
    """H x keeps norms and dot products; H (H x) = x; H of a one-hot row is +-1/sqrt(D) in
    every entry (one large channel spread over all of them)."""
    generator = torch.Generator().manual_seed(3)
    for dim in (8, 64, 256):
        x, y = torch.randn(2, 5, dim, generator=generator).double()
        torch.testing.assert_close(hadamard(hadamard(x)), x.float(), atol=1e-5, rtol=0)
        torch.testing.assert_close((hadamard(x) * hadamard(y)).sum(-1), (x * y).sum(-1).float(),
                                   atol=1e-4, rtol=1e-5)
        spread = hadamard(torch.eye(dim)[:1] * 8)
        torch.testing.assert_close(spread.abs(), torch.full((1, dim), 8 / dim**0.5))


@pytest.mark.parametrize("spread", [1e-3, 1.0, 300.0])
def test_round_trip_keeps_a_sixteenth_of_each_row(spread):
    """A row is stored as fp8 of its Hadamard transform: it comes back within 1/16 of its norm
    (plus 2^-10 per value for subnormals) where no rotated value passes 448, rotated values
    past 448 are stored as +-448, and decoding and encoding again gives the same values."""
    x = torch.randn(400, 64, generator=torch.Generator().manual_seed(0)) * spread
    x[0, :4] = torch.tensor([1e4, -1e4, 450.0, -460.0])
    rows = FP8.encode(x)  # (400, 64)
    assert rows.dtype == torch.float8_e4m3fn and rows.shape == x.shape
    assert torch.equal(as_bits(rows), as_bits(hadamard(x).to(torch.float8_e4m3fn)))
    back = FP8.decode(rows)
    assert back.dtype == torch.float32
    inside = hadamard(x).abs().amax(-1) <= FP8_MAX  # (400,)
    assert not bool(inside[0]) and float(rows[0].float().abs().max()) == FP8_MAX
    error = (back - x).norm(dim=-1)[inside]
    bound = x.norm(dim=-1)[inside] / 16 + 64**0.5 * 2.0**-10
    assert bool((error <= bound).all())
    assert torch.equal(FP8.encode(back).float(), rows.float())  # the same values (0 may be -0)


def test_a_head_dimension_that_is_not_a_power_of_two_is_refused():
    with pytest.raises(ValueError, match=r"power-of-two head dimension.*--kv-dtype int8"):
        FP8.row_width(96)
    with pytest.raises(ValueError, match="power-of-two head dimension"):
        engine_for(random_model(tiny_config(head_dim=24)), kv_dtype=torch.float8_e4m3fn)


def test_a_slot_is_one_byte_a_value():
    assert FP8.row_width(64) == 64 and kv_slot_bytes(torch.float8_e4m3fn, 64) == 2 * 64


def fp8_case(batch: int, num_heads: int, num_kv_heads: int, slots: int, dim: int, seed: int):
    """q, new keys and values (B, H*, 1, D) float32, an fp8 cache (B, Hkv, S, D) whose first
    rows hold every finite byte, each row's slot and the empty slots."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, num_heads, 1, dim, generator=generator) / 4
    k_new = torch.randn(batch, num_kv_heads, 1, dim, generator=generator)
    v_new = torch.randn(batch, num_kv_heads, 1, dim, generator=generator) * 100
    k = FP8.encode(torch.randn(batch, num_kv_heads, slots, dim, generator=generator) * 3)
    v = FP8.encode(torch.randn(batch, num_kv_heads, slots, dim, generator=generator) * 3)
    values = every_finite_value()
    count = min(values.numel(), k.numel())
    k.view(-1)[:count] = values[:count]
    as_bits(v).view(-1)[:count] = as_bits(values).flip(0)[:count]
    written = torch.randint(0, slots, (batch,), generator=generator)
    empty = torch.rand(batch, slots, generator=generator) < 0.3
    empty[torch.arange(batch), written] = False
    return q, k_new, v_new, k, v, written, empty


@pytest.mark.parametrize("cap", kernels.distinct_caps())  # each path the CPU has, to plain C++
@pytest.mark.parametrize("slots", [3, 30, 270])  # against tiles of 4, 16 and 256 slots
@pytest.mark.parametrize("group", [1, 3, 8])  # query heads per KV head
@pytest.mark.parametrize("dim", [8, 64, 256])
def test_kernel_fp8_path_matches_reference_for_every_tiling(kernel_cap, dim, group, slots,
                                                            cap):
    """The kernel writes the step's rows byte for byte as torch rounds them (values past 448
    saturate) and widens every byte exactly: a wrongly placed exponent or sign bit, or a
    subnormal read as a normal, is off by far more than float32 rounding."""
    kernel_cap(cap)
    q, k_new, v_new, k, v, written, empty = fp8_case(2, 2 * group, 2, slots, dim,
                                                     seed=dim + slots + group)
    want, k_after, v_after = expected_after_write(q, k_new, v_new, k, v, written, empty)
    got = slot_attention(q, k, v, k_new, v_new, written, empty)
    assert torch.equal(as_bits(k), as_bits(k_after)) and torch.equal(as_bits(v), as_bits(v_after))
    # values reach 448 (every finite byte is in the cache): float32 rounding relative to them
    torch.testing.assert_close(got.double(), want, atol=1e-3, rtol=1e-5)


def test_kernel_rounds_a_bfloat16_step_as_kvquant_does():
    q, k_new, v_new, k, v, written, empty = fp8_case(3, 6, 2, 40, 64, seed=5)
    k_new, v_new = k_new.bfloat16(), v_new.bfloat16()
    _, k_after, v_after = expected_after_write(q, k_new, v_new, k, v, written, empty)
    slot_attention(q, k, v, k_new, v_new, written, empty)
    assert torch.equal(as_bits(k), as_bits(k_after)) and torch.equal(as_bits(v), as_bits(v_after))


def test_grouped_matmuls_read_an_fp8_cache():
    """The op off the CPU: the same write, float32 arithmetic over the widened cache."""
    q, k_new, v_new, k, v, written, empty = fp8_case(2, 6, 2, 64, 16, seed=1)
    want, k_after, v_after = expected_after_write(q, k_new, v_new, k, v, written, empty)
    got = kernels.grouped_slot_attention(q[:, :, 0], k, v, k_new[:, :, 0], v_new[:, :, 0],
                                         written, empty)
    assert torch.equal(as_bits(k), as_bits(k_after)) and torch.equal(as_bits(v), as_bits(v_after))
    torch.testing.assert_close(got[:, :, None].double(), want, atol=1e-3, rtol=1e-5)


def test_nan_bytes_in_empty_slots_never_contribute():
    q, k_new, v_new, k, v, written, empty = fp8_case(2, 4, 2, 300, 64, seed=2)
    poisoned_k, poisoned_v = k.clone(), v.clone()
    as_bits(poisoned_k).transpose(1, 2)[empty] = 0x7F  # NaN
    as_bits(poisoned_v).transpose(1, 2)[empty] = 0x7F
    got = slot_attention(q, poisoned_k, poisoned_v, k_new, v_new, written, empty)
    assert not bool(got.isnan().any())
    torch.testing.assert_close(got, slot_attention(q, k, v, k_new, v_new, written, empty),
                               atol=1e-5, rtol=0)


def test_an_fp8_cache_travels_as_its_bytes():
    """Prefill rounds each kept token once; a pool and a blob carry those bytes unchanged, and a
    float cache is rounded exactly as kvquant rounds it on the way in."""
    model = random_model(tiny_config())
    fp8_engine = engine_for(model, kv_dtype=torch.float8_e4m3fn)
    cache = fp8_engine.prefill(list(range(50)), POLICY, max_new_tokens=4).cache
    float_cache = engine_for(model).prefill(list(range(50)), POLICY, max_new_tokens=4).cache
    (part,), (float_part,) = cache.groups, float_cache.groups
    assert part.k.dtype == torch.float8_e4m3fn
    assert torch.equal(as_bits(part.k), as_bits(FP8.encode(float_part.k)))
    pool = BatchCache(fp8_engine.config, cache.layout, batch_size=2, dtype=torch.float8_e4m3fn)
    pool.insert(0, cache)
    pool.insert(1, float_cache)
    (rows,) = pool.groups
    assert torch.equal(as_bits(rows.k[:, 0]), as_bits(part.k))
    assert torch.equal(as_bits(rows.v[:, 1]), as_bits(part.v))
    spec = BlobSpec.for_model(fp8_engine.config, b"\x01" * 32, torch.float8_e4m3fn)
    seal = Seal(ClusterSecret(b"a test cluster secret"), "blob-key")
    (back,) = decode_blob(encode_blob(cache, spec, seal), spec, seal).groups
    for name in ("k", "v"):
        assert torch.equal(as_bits(getattr(back, name)), as_bits(getattr(part, name))), name
    assert torch.equal(back.positions, part.positions)
    slots = cache.layout.num_slots * fp8_engine.config.num_kv_heads
    assert spec.payload_size(cache.layout) == slots * (2 * fp8_engine.config.head_dim + 4)


PROMPTS = [[3, 17, 99, 4, 5], list(range(40, 75)), [7] * 12 + list(range(200, 230))]


@pytest.mark.parametrize("ids", PROMPTS)
def test_fp8_decode_stays_near_float32_on_a_tiny_model(ids):
    """Against float32 KV, fp8 moves the logits by a small fraction of their spread (its
    relative error per value is at most 1/16, int8's 1/254 of a row's largest)."""
    model = random_model(tiny_config(num_heads=6, num_kv_heads=2, head_dim=32), seed=4)
    policy = CachePolicy(n_sink=2, n_topk=10, n_recent=8, observation=4)
    tokens, logits, _ = greedy_with_logits(engine_for(model), ids, policy, 12)
    fp8 = engine_for(model, kv_dtype=torch.float8_e4m3fn)
    result = fp8.prefill(ids, policy, max_new_tokens=12)
    decoder = fp8.new_decoder(result.cache.layout, batch_size=1)
    decoder.cache.insert(0, result.cache)
    fp8_logits = [result.logits]
    for step, token in enumerate(tokens[:-1]):  # teacher-forced along float32's tokens
        position = torch.tensor([result.cache.next_position + step])
        fp8_logits.append(decoder.step(torch.tensor([token]), position)[0])
    assert float((torch.stack(fp8_logits) - logits).abs().max()) < 0.1 * float(logits.std())


def test_engine_takes_fp8_by_name(tiny_model_dir):
    engine = Engine.from_pretrained(tiny_model_dir, kv_dtype="float8_e4m3fn")
    assert engine.kv_dtype == torch.float8_e4m3fn
