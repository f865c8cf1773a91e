from __future__ import annotations

import dataclasses

import pytest
import torch

from kvstore.blob_errors import (
    BlobCorrupted,
    BlobForged,
    BlobLayoutMismatch,
    BlobModelMismatch,
    BlobTokensMismatch,
    BlobTruncated,
    BlobVersionMismatch,
)
from kvstore.codec import VERSION, BlobSpec, decode_blob, encode_blob, header_size
from kvstore.seal import ClusterSecret, Seal, tokens_digest
from snapstream.config import FULL, SLIDING
from snapstream.fingerprint import model_fingerprint
from snapstream.kvquant import kv_float
from snapstream.policy import CacheLayout, CachePolicy
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config

POLICY = CachePolicy(n_sink=4, n_topk=20, n_recent=12, observation=8)
# a hybrid model: two sliding-window layers of window 16 around a global one
HYBRID = dict(num_layers=3, layer_types=(SLIDING, FULL, SLIDING), sliding_window=16)


SECRET = ClusterSecret(b"a test cluster secret")
TOKENS = tokens_digest(range(200))
SEAL = Seal(SECRET, "blob-key", TOKENS)  # as the writer seals and a reader who knows the tokens
READ = Seal(SECRET, "blob-key", None)  # a reader who checks no tokens (a decode worker)


@pytest.fixture(scope="module", params=["llama", "hybrid"])
def engine(request):
    return engine_for(random_model(tiny_config(**(HYBRID if request.param == "hybrid" else {}))))


@pytest.fixture(scope="module")
def spec(engine):
    return BlobSpec.for_model(engine.config, model_fingerprint(engine.model), torch.float32)


def _blob(engine, spec, length=200):
    cache = engine.prefill([i % 256 for i in range(length)], POLICY, max_new_tokens=8).cache
    return cache, encode_blob(cache, spec, SEAL)


def test_round_trip_is_bit_exact(engine, spec):
    cache, blob = _blob(engine, spec)
    back = decode_blob(bytes(blob), spec, READ, layout=cache.layout)
    assert back.layout == cache.layout
    for got, sent in zip(back.groups, cache.groups, strict=True):
        for name in ("k", "v", "positions"):
            assert torch.equal(getattr(got, name), getattr(sent, name)), name
    assert (back.prompt_len, back.next_position) == (200, 200)


def test_a_hybrid_blob_carries_both_layer_kinds(engine, spec):
    _, blob = _blob(engine, spec)
    back = decode_blob(blob, spec, READ)
    windows = engine.config.attention_windows
    assert [g.window for g in back.layout.groups] == ([None, 16] if windows[0] else [None])
    for part in back.groups:
        expected = POLICY.layout(1, 1) if part.group.window is None else \
            CacheLayout(n_sink=0, n_topk=0, n_recent=16, n_ring=16)
        assert part.group.layout == expected
        assert part.group.layers == tuple(i for i, w in enumerate(windows)
                                          if w == part.group.window)


def test_bfloat16_round_trip(engine):
    spec = BlobSpec.for_model(engine.config, b"\x01" * 32, torch.bfloat16)
    cache = engine.prefill(list(range(90)), POLICY, max_new_tokens=8).cache
    back = decode_blob(encode_blob(cache, spec, SEAL), spec, READ)
    assert all(torch.equal(got.k, sent.k.to(torch.bfloat16))
               for got, sent in zip(back.groups, cache.groups, strict=True))


def test_int8_round_trip_carries_codes_and_scales_as_they_are(engine):
    """An int8 engine's cache (quantized once at prefill) comes back byte for byte, each row D
    codes + a float32 scale; the blob is (D + 4) / (4 D) of float32's K/V plus positions."""
    spec = BlobSpec.for_model(engine.config, b"\x01" * 32, torch.int8)
    int8_engine = engine_for(engine.model, kv_dtype=torch.int8)
    cache = int8_engine.prefill(list(range(90)), POLICY, max_new_tokens=8).cache
    back = decode_blob(encode_blob(cache, spec, SEAL), spec, READ)
    for got, sent in zip(back.groups, cache.groups, strict=True):
        assert got.k.dtype == torch.int8 and got.k.shape[-1] == engine.config.head_dim + 4
        for name in ("k", "v", "positions"):
            assert torch.equal(getattr(got, name), getattr(sent, name)), name
    layout = cache.layout
    slots = layout.num_slots * engine.config.num_kv_heads
    assert spec.payload_size(layout) == slots * (2 * (engine.config.head_dim + 4) + 4)
    float_spec = dataclasses.replace(spec, dtype=torch.float32)
    with pytest.raises(BlobLayoutMismatch, match=r"dtype torch\.int8, expected torch\.float32"):
        decode_blob(encode_blob(cache, spec, SEAL), float_spec, READ)


def test_a_float_cache_is_quantized_into_an_int8_blob(engine):
    spec = BlobSpec.for_model(engine.config, b"\x01" * 32, torch.int8)
    cache = engine.prefill(list(range(90)), POLICY, max_new_tokens=8).cache  # float32 K/V
    back = decode_blob(encode_blob(cache, spec, SEAL), spec, READ)
    for got, sent in zip(back.groups, cache.groups, strict=True):
        scale = got.k[..., -4:].contiguous().view(torch.float32)  # (Lg, Hkv, S, 1)
        error = (kv_float(got.k) - sent.k).abs()
        assert bool((error <= scale / 2 + 1e-6).all())


def test_size_is_independent_of_prompt_length(engine, spec):
    sizes = {len(_blob(engine, spec, n)[1]) for n in (3, 36, 37, 500)}
    assert sizes == {spec.blob_size(spec.model_layout(POLICY.layout(1, 1)))}


def test_decode_views_the_buffer_without_copying(engine, spec):
    cache, blob = _blob(engine, spec)
    back = decode_blob(blob, spec, READ)
    start = header_size(cache.layout)
    blob[start] ^= 0xFF  # the view sees the change: no copy was made
    assert back.groups[0].k.view(-1).view(torch.uint8)[0] == blob[start]
    blob[-1] ^= 0xFF  # the last group's positions too
    assert back.groups[-1].positions.view(-1).view(torch.uint8)[-1] == blob[-1]


def test_truncated(engine, spec):
    _, blob = _blob(engine, spec)
    with pytest.raises(BlobForged, match="fails its MAC"):  # a payload cut short
        decode_blob(blob[:-1], spec, READ)
    with pytest.raises(BlobTruncated, match="header"):
        decode_blob(blob[:10], spec, READ)


@pytest.mark.parametrize("where", ["payload", "end", "group count", "prompt length",
                                   "group table", "token digest", "mac"])
def test_bit_flip_is_detected(engine, spec, where):
    cache, blob = _blob(engine, spec)
    offset = {"payload": header_size(cache.layout) + 5, "end": -1, "group count": 60,
              "prompt length": 62, "token digest": 100, "mac": header_size(cache.layout) - 1,
              "group table": header_size(cache.layout) - 40}[where]
    blob[offset] ^= 0x10
    with pytest.raises(BlobCorrupted, match="fails its MAC"):
        decode_blob(blob, spec, READ)


def test_wrong_version(engine, spec):
    _, blob = _blob(engine, spec)
    blob[8] = 99
    with pytest.raises(BlobVersionMismatch, match="version 99"):
        decode_blob(blob, spec, READ)


def test_a_version_1_blob_is_refused(engine, spec):
    """The first format (one layout for every layer, a 112-byte header) is refused by its
    version field before anything else is read."""
    cache, _ = _blob(engine, spec)
    old = bytearray(b"SNAPKV\x00\x00" + (1).to_bytes(2, "little") + (112).to_bytes(2, "little"))
    old += bytes(112 - len(old) + spec.payload_size(cache.layout))
    with pytest.raises(BlobVersionMismatch, match=f"version 1, this reader handles {VERSION}"):
        decode_blob(old, spec, READ)


def test_a_version_3_blob_is_refused(engine, spec):
    """Version 3 (unkeyed CRCs, no token digest) is refused by its version field before its
    MAC is read."""
    assert VERSION == 4
    _, blob = _blob(engine, spec)
    blob[8:10] = (3).to_bytes(2, "little")
    with pytest.raises(BlobVersionMismatch, match="version 3, this reader handles 4"):
        decode_blob(blob, spec, READ)


def test_wrong_model(engine, spec):
    _, blob = _blob(engine, spec)
    other = dataclasses.replace(spec, fingerprint=b"\x00" * 32)
    with pytest.raises(BlobModelMismatch, match="model"):
        decode_blob(blob, other, READ)
    with pytest.raises(BlobModelMismatch, match="layers"):
        decode_blob(blob, dataclasses.replace(spec, num_layers=spec.num_layers + 1), READ)


def test_layer_groups_of_another_layer_pattern_are_refused(engine, spec):
    _, blob = _blob(engine, spec)
    other = (None,) * spec.num_layers if spec.windows[0] else (7, *spec.windows[1:])
    with pytest.raises(BlobLayoutMismatch, match="layer groups"):
        decode_blob(blob, dataclasses.replace(spec, windows=other), READ)


def test_wrong_layout_or_dtype(engine, spec):
    _, blob = _blob(engine, spec)
    other = spec.model_layout(CachePolicy(n_sink=4, n_topk=21, n_recent=11).layout(1, 1))
    with pytest.raises(BlobLayoutMismatch, match="layout"):
        decode_blob(blob, spec, READ, layout=other)
    with pytest.raises(BlobLayoutMismatch, match="dtype"):
        decode_blob(blob, dataclasses.replace(spec, dtype=torch.bfloat16), READ)


def test_fingerprint_changes_with_any_weight(engine):
    model = random_model(tiny_config())
    before = model_fingerprint(model)
    with torch.no_grad():
        model.model.layers[1].mlp.gate_up_proj.weight[3, 4] += 1e-3
    assert model_fingerprint(model) != before


def test_a_blob_of_the_retired_fp8_code_is_refused(engine, monkeypatch):
    """Code 5 held fp8 rows of the values themselves; fp8 rows now hold their Hadamard transform
    (code 6), so an old blob is refused rather than read as rotated rows."""
    import kvstore.codec as codec

    spec = BlobSpec.for_model(engine.config, b"\x01" * 32, torch.float8_e4m3fn)
    cache = engine_for(engine.model, kv_dtype=torch.float8_e4m3fn).prefill(
        list(range(40)), POLICY, max_new_tokens=8).cache
    monkeypatch.setitem(codec.DTYPE_CODES, torch.float8_e4m3fn, 5)
    old = encode_blob(cache, spec, SEAL)
    monkeypatch.undo()
    with pytest.raises(BlobLayoutMismatch, match=r"blob dtype 5, expected torch\.float8_e4m3fn"):
        decode_blob(old, spec, READ)
    assert decode_blob(encode_blob(cache, spec, SEAL), spec, READ).prompt_len == cache.prompt_len


def test_a_blob_sealed_with_another_secret_or_moved_to_another_key_is_forged(engine, spec):
    cache, blob = _blob(engine, spec)
    forged = encode_blob(cache, spec, Seal(ClusterSecret(b"the store password, guessed"),
                                           "blob-key", TOKENS))
    with pytest.raises(BlobForged, match="fails its MAC"):
        decode_blob(forged, spec, READ)
    with pytest.raises(BlobForged, match="'popular-document'"):
        decode_blob(blob, spec, Seal(SECRET, "popular-document", None))


def test_a_reader_that_knows_the_tokens_checks_them(engine, spec):
    _, blob = _blob(engine, spec)
    assert decode_blob(blob, spec, SEAL).prompt_len == 200
    with pytest.raises(BlobTokensMismatch, match="other tokens"):
        decode_blob(blob, spec, Seal(SECRET, "blob-key", tokens_digest(range(199))))
