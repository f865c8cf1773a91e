from __future__ import annotations

import dataclasses

import pytest
import torch

from kvstore.codec import (
    HEADER_SIZE,
    BlobCorrupted,
    BlobLayoutMismatch,
    BlobModelMismatch,
    BlobSpec,
    BlobTruncated,
    BlobVersionMismatch,
    decode_blob,
    encode_blob,
)
from snapstream.fingerprint import model_fingerprint
from snapstream.policy import CachePolicy
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config

POLICY = CachePolicy(n_sink=4, n_topk=20, n_recent=12, window=8)


@pytest.fixture(scope="module")
def engine():
    return engine_for(random_model(tiny_config()))


@pytest.fixture(scope="module")
def spec(engine):
    return BlobSpec.for_model(engine.config, model_fingerprint(engine.model), torch.float32)


def _blob(engine, spec, length=200):
    cache = engine.prefill([i % 256 for i in range(length)], POLICY, max_new_tokens=8).cache
    return cache, encode_blob(cache, spec)


def test_round_trip_is_bit_exact(engine, spec):
    cache, blob = _blob(engine, spec)
    back = decode_blob(bytes(blob), spec, layout=cache.layout)
    for name in ("k", "v", "positions"):
        assert torch.equal(getattr(back, name), getattr(cache, name)), name
    assert (back.prompt_len, back.next_position) == (200, 200)


def test_bfloat16_round_trip(engine):
    spec = BlobSpec.for_model(engine.config, b"\x01" * 32, torch.bfloat16)
    cache = engine.prefill(list(range(90)), POLICY, max_new_tokens=8).cache
    back = decode_blob(encode_blob(cache, spec), spec)
    assert torch.equal(back.k, cache.k.to(torch.bfloat16))


def test_size_is_independent_of_prompt_length(engine, spec):
    sizes = {len(_blob(engine, spec, n)[1]) for n in (3, 36, 37, 500)}
    assert sizes == {spec.blob_size(POLICY.layout(1, 1))}


def test_decode_views_the_buffer_without_copying(engine, spec):
    _, blob = _blob(engine, spec)
    back = decode_blob(blob, spec)
    blob[HEADER_SIZE] ^= 0xFF  # the view sees the change: no copy was made
    assert back.k.view(-1).view(torch.uint8)[0] == blob[HEADER_SIZE]


def test_truncated(engine, spec):
    _, blob = _blob(engine, spec)
    with pytest.raises(BlobTruncated, match="payload"):
        decode_blob(blob[:-1], spec)
    with pytest.raises(BlobTruncated, match="header"):
        decode_blob(blob[:10], spec)


@pytest.mark.parametrize("offset", [HEADER_SIZE + 5, -1, 60])
def test_bit_flip_is_detected(engine, spec, offset):
    _, blob = _blob(engine, spec)
    blob[offset] ^= 0x10
    with pytest.raises(BlobCorrupted, match="checksum"):
        decode_blob(blob, spec)


def test_wrong_version(engine, spec):
    _, blob = _blob(engine, spec)
    blob[8] = 99
    with pytest.raises(BlobVersionMismatch, match="version 99"):
        decode_blob(blob, spec)


def test_wrong_model(engine, spec):
    _, blob = _blob(engine, spec)
    other = dataclasses.replace(spec, fingerprint=b"\x00" * 32)
    with pytest.raises(BlobModelMismatch, match="model"):
        decode_blob(blob, other)
    with pytest.raises(BlobModelMismatch, match="layers"):
        decode_blob(blob, dataclasses.replace(spec, num_layers=3))


def test_wrong_layout_or_dtype(engine, spec):
    _, blob = _blob(engine, spec)
    other = CachePolicy(n_sink=4, n_topk=21, n_recent=11, window=8).layout(1, 1)
    with pytest.raises(BlobLayoutMismatch, match="layout"):
        decode_blob(blob, spec, layout=other)
    with pytest.raises(BlobLayoutMismatch, match="dtype"):
        decode_blob(blob, dataclasses.replace(spec, dtype=torch.bfloat16))


def test_fingerprint_changes_with_any_weight(engine):
    model = random_model(tiny_config())
    before = model_fingerprint(model)
    with torch.no_grad():
        model.model.layers[1].mlp.gate_up_proj.weight[3, 4] += 1e-3
    assert model_fingerprint(model) != before
