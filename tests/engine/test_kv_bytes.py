"""KV byte counts (what benchmarks and the demo report) equal the bytes the caches really hold:
a decode pool's row and a blob, in bfloat16, int8 (with its per-row scale) and fp8 e4m3 (none)."""

from __future__ import annotations

import pytest
import torch

from kvstore.codec import BlobSpec, encode_blob
from kvstore.seal import ClusterSecret, Seal
from snapstream.config import FULL, SLIDING
from snapstream.fingerprint import model_fingerprint
from snapstream.kvcache import BatchCache, ModelLayout, pool_row_bytes
from snapstream.kvquant import kv_slot_bytes
from snapstream.policy import CachePolicy
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config

POLICY = CachePolicy(n_sink=4, n_topk=20, n_recent=12, observation=8)


def test_a_slot_holds_k_and_v_rows_in_the_kv_dtype():
    assert kv_slot_bytes(torch.bfloat16, 64) == 2 * 64 * 2
    assert kv_slot_bytes(torch.int8, 64) == 2 * (64 + 4)  # codes + a float32 scale per row
    assert kv_slot_bytes(torch.float8_e4m3fn, 64) == 2 * 64  # one byte a value, no scale
    assert kv_slot_bytes(torch.float32, 64) == 2 * 64 * 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("layers", [{}, dict(num_layers=3, layer_types=(SLIDING, FULL, SLIDING),
                                             sliding_window=16)])
def test_pool_row_bytes_is_what_a_pool_row_holds(dtype, layers):
    config = tiny_config(**layers)
    layout = ModelLayout.build(config.attention_windows, POLICY.layout(200, 8))
    pool = BatchCache(config, layout, batch_size=3, dtype=dtype)
    held = sum(t.nbytes for g in pool.groups for t in (g.k, g.v, g.filled))
    assert pool_row_bytes(config, layout, dtype) * 3 == held


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8, torch.float8_e4m3fn])
def test_a_blob_is_its_slots_plus_positions_plus_header(dtype):
    engine = engine_for(random_model(tiny_config()))
    spec = BlobSpec.for_model(engine.config, model_fingerprint(engine.model), dtype)
    cache = engine.prefill([i % 256 for i in range(200)], POLICY, max_new_tokens=8).cache
    slots = cache.layout.num_slots * engine.config.num_kv_heads
    payload = slots * (kv_slot_bytes(dtype, engine.config.head_dim) + 4)  # + int32 position
    seal = Seal(ClusterSecret(b"a test cluster secret"), "blob-key")
    assert len(encode_blob(cache, spec, seal)) == spec.blob_size(cache.layout)
    assert spec.payload_size(cache.layout) == payload
