"""One compiled decode graph serves every mix of context lengths (no recompilation)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.utils

from snapstream.compress import build_sequence_cache
from snapstream.config import FULL, SLIDING
from snapstream.decode import Decoder
from snapstream.kvcache import BatchCache, SequenceCache
from snapstream.policy import CachePolicy
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config

POLICY = CachePolicy(n_sink=4, n_topk=24, n_recent=16, observation=8)
# two sliding-window layers of window 20 (longer than POLICY's ring) around a global one
HYBRID = dict(num_layers=3, layer_types=(SLIDING, FULL, SLIDING), sliding_window=20)


def long_context_cache(engine, context_len: int, seed: int) -> SequenceCache:
    """A compressed cache as prefill of ``context_len`` tokens leaves it: the last token sits at
    position context_len - 1. K/V are random (their values do not change the graph), and so are
    SnapKV's scores, as prefill of a 100k prompt would be too slow for a test."""
    config = engine.config
    gen = torch.Generator().manual_seed(seed)
    shape = (config.num_layers, config.num_kv_heads, context_len, config.head_dim)
    k, v = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    scores = torch.rand(shape[:-1], generator=gen)  # (L, Hkv, P)
    layout = engine.model_layout(POLICY.layout(context_len, 1))
    return build_sequence_cache(layout, k, v, scores)


@pytest.mark.slow
@pytest.mark.parametrize("hybrid", [False, True])
def test_joining_and_leaving_never_recompiles(hybrid):
    """Also on a hybrid model: a global layer group and a sliding one (a ring of its window)
    in one compiled graph."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    config = tiny_config(**(HYBRID if hybrid else {}))
    engine = engine_for(random_model(config))
    layout = engine.model_layout(POLICY.layout(1, 1))
    assert len(layout.groups) == (2 if hybrid else 1)
    batch = BatchCache(engine.config, layout, batch_size=4, dtype=torch.float32)
    decoder = Decoder(engine.model, batch, compile=True)
    eager = Decoder(engine.model, BatchCache(engine.config, layout, 4, torch.float32))
    contexts = [10, 100_000, 57, 4096, 33_333, 12, 65_536, 99_999, 30]
    rows: dict[int, int] = {}  # row -> next position
    tokens = torch.zeros(4, dtype=torch.long)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step, context in enumerate(contexts):
            row = step % 4  # a new sequence replaces the one in this row (leave + join)
            cache = long_context_cache(engine, context, seed=step)
            for pool in (decoder, eager):
                pool.cache.clear(row)
                pool.cache.insert(row, cache)
            rows[row] = context
            for _ in range(3):
                positions = torch.tensor([rows.get(r, 0) for r in range(4)])
                logits = decoder.step(tokens, positions)
                expected = eager.step(tokens, positions)
                torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
                tokens = logits.argmax(-1)
                rows = {r: p + 1 for r, p in rows.items()}
    for got, expected in zip(decoder.cache.groups, eager.cache.groups, strict=True):
        assert torch.equal(got.filled, expected.filled)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
