"""One compiled decode graph serves every mix of context lengths (no recompilation)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.utils

from snapstream.compress import build_sequence_cache
from snapstream.decode import Decoder
from snapstream.kvcache import BatchCache, SequenceCache
from snapstream.policy import CachePolicy
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config

POLICY = CachePolicy(n_sink=4, n_topk=24, n_recent=16, window=8)


def long_context_cache(engine, context_len: int, seed: int) -> SequenceCache:
    """A compressed cache as prefill of ``context_len`` tokens leaves it: the last token sits at
    position context_len - 1. K/V are random (their values do not change the graph); SnapKV picks
    are random positions, as prefill of a 100k prompt would be too slow for a test."""
    config, layout = engine.config, POLICY.layout(context_len, 1)
    gen = torch.Generator().manual_seed(seed)
    shape = (config.num_layers, config.num_kv_heads, context_len, config.head_dim)
    if context_len <= layout.n_kept:
        k, v = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
        return build_sequence_cache(layout, k, v, None)
    small = (*shape[:2], layout.budget, config.head_dim)
    picks = torch.randperm(context_len - layout.n_sink - layout.n_recent, generator=gen)
    selected = (picks[: layout.n_topk] + layout.n_sink).sort().values
    positions = torch.cat((torch.arange(layout.n_sink), selected,
                           torch.arange(context_len - layout.n_recent, context_len)))
    return SequenceCache(layout=layout, k=torch.randn(small, generator=gen),
                         v=torch.randn(small, generator=gen),
                         positions=positions.int().expand(*shape[:2], -1).contiguous(),
                         prompt_len=context_len, next_position=context_len)


@pytest.mark.slow
def test_joining_and_leaving_never_recompiles():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    engine = engine_for(random_model(tiny_config()))
    batch = BatchCache(engine.config, POLICY.layout(1, 1), batch_size=4, dtype=torch.float32)
    decoder = Decoder(engine.model, batch, compile=True)
    eager = Decoder(engine.model, BatchCache(engine.config, batch.layout, 4, torch.float32))
    contexts = [10, 100_000, 57, 4096, 33_333, 12, 65_536, 99_999]
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
    assert torch.equal(decoder.cache.positions, eager.cache.positions)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
