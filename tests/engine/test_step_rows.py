"""A decode step runs the power-of-two prefix of the pool that covers the rows in use; where the
fused kernels run, each row's logits and cache writes are the same at any row count."""

from __future__ import annotations

import asyncio

import pytest
import torch

from decode_svc.backends import BackendConfig, make_backend
from decode_svc.loop import DecodeLoop
from serving import metrics
from snapstream import kernels
from snapstream.decode import Decoder
from snapstream.engine import Engine
from snapstream.kvcache import BatchCache
from snapstream.kvquant import as_bits
from snapstream.policy import CachePolicy
from snapstream.quant import GEMM_MIN_ROWS, QUANT_SCHEMES, quantize_model
from snapstream.sampling_params import SamplingParams
from tests.engine.helpers import engine_for
from tests.engine.test_fused_decode import CONFIGS
from tests.integration.test_decode_isolation import PROMPTS, decode_in_loop
from tests.integration.test_services import ENGINE_POLICY
from tests.tiny_models import random_model, tiny_config

POLICY = CachePolicy(n_sink=4, n_topk=24, n_recent=16, observation=8)
ROWS = 8


def pool(engine, prompts: list[list[int]]) -> tuple[Decoder, list[int]]:
    """A pool of ROWS rows, the first len(prompts) holding one prefilled prompt each -> its
    decoder and those rows' next positions."""
    results = [engine.prefill(ids, POLICY, max_new_tokens=16) for ids in prompts]
    cache = BatchCache(engine.config, results[0].cache.layout, ROWS, engine.kv_dtype)
    for row, result in enumerate(results):
        cache.insert(row, result.cache)
    return Decoder(engine.model, cache), [result.cache.next_position for result in results]


def test_fused_pools_step_the_covering_power_of_two():
    engine = engine_for(quantize_model(random_model(tiny_config()), QUANT_SCHEMES["int4"]))
    decoder, _ = pool(engine, [[1, 2, 3]])
    assert [decoder.step_rows(n) for n in range(1, ROWS + 1)] == [1, 2, 4, 4, 8, 8, 8, 8]
    with pytest.raises(ValueError, match=r"rows_in_use must be in \[1, 8\]"):
        decoder.step_rows(ROWS + 1)


def test_pools_without_fused_kernels_step_every_row():
    """Float weights (torch's GEMM) and pools of GEMM_MIN_ROWS rows or more: a GEMM's sums may
    depend on its row count, so every step runs the whole pool."""
    engine = engine_for(random_model(tiny_config()))
    decoder, _ = pool(engine, [[1, 2, 3]])
    assert {decoder.step_rows(n) for n in range(1, ROWS + 1)} == {ROWS}
    quantized = engine_for(quantize_model(random_model(tiny_config()), QUANT_SCHEMES["int8"]))
    layout = quantized.prefill([1, 2, 3], POLICY, max_new_tokens=4).cache.layout
    large = Decoder(quantized.model, BatchCache(quantized.config, layout, GEMM_MIN_ROWS,
                                                quantized.kv_dtype))
    assert large.step_rows(1) == GEMM_MIN_ROWS


@pytest.mark.parametrize("cap", kernels.distinct_caps())
@pytest.mark.parametrize("scheme", ["int4", "int8"])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_a_rows_result_does_not_depend_on_the_row_count(kernel_cap, cap, scheme, family):
    """Rows 0-2 stepped in a step of 4 rows and in one of all 8 (rows 3-7 empty): the same
    logits bit for bit, and the same K/V written into their slots."""
    kernel_cap(cap)
    engine = engine_for(quantize_model(random_model(CONFIGS[family]()), QUANT_SCHEMES[scheme]),
                        kv_dtype=torch.int8)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 200, (length,), generator=gen).tolist()
               for length in (70, 23, 41)]
    (short, next_positions), (whole, _) = pool(engine, prompts), pool(engine, prompts)
    tokens, positions = torch.tensor([5, 6, 7]), torch.tensor(next_positions)
    padding = torch.zeros(ROWS - len(prompts), dtype=torch.long)
    for _ in range(4):
        rows = short.step_rows(len(prompts))
        assert rows == 4
        got = short.step(torch.cat((tokens, padding[: rows - 3])),
                         torch.cat((positions, padding[: rows - 3])))[:3]
        expected = whole.step(torch.cat((tokens, padding)), torch.cat((positions, padding)))[:3]
        assert torch.equal(got, expected)
        tokens, positions = expected.argmax(-1), positions + 1
    for got, expected in zip(short.cache.groups, whole.cache.groups, strict=True):
        assert torch.equal(as_bits(got.k[:, :3]), as_bits(expected.k[:, :3]))
        assert torch.equal(as_bits(got.v[:, :3]), as_bits(expected.v[:, :3]))
        assert torch.equal(got.filled[:3], expected.filled[:3])


def _step_rows_seen() -> tuple[float, float]:
    """(steps, rows stepped) the decode loops of this process have recorded so far."""
    samples = {s.name: s.value for m in metrics.STEP_ROWS.collect() for s in m.samples}
    return samples["snapstream_decode_step_rows_count"], samples["snapstream_decode_step_rows_sum"]


async def test_the_loop_steps_only_the_rows_in_use(tiny_model_dir):
    """A lone sequence in a pool of 8 rows: one-row steps, and the tokens the engine decodes
    alone; three at once: steps of at most 4 rows."""
    engine = Engine.from_pretrained(tiny_model_dir, dtype="int4")
    loop = DecodeLoop(engine, make_backend(BackendConfig(), engine.config), rows=ROWS,
                      max_queue=8)
    loop.start()
    try:
        before = _step_rows_seen()
        alone = await decode_in_loop(loop, engine, PROMPTS[0], SamplingParams(), 12)
        steps, rows = (a - b for a, b in zip(_step_rows_seen(), before, strict=True))
        assert steps >= 10 and rows == steps
        assert alone == engine.generate(PROMPTS[0], 12, policy=ENGINE_POLICY).token_ids
        before = _step_rows_seen()
        together = await asyncio.gather(*(decode_in_loop(loop, engine, p, SamplingParams(), 12)
                                          for p in PROMPTS))
        steps, rows = (a - b for a, b in zip(_step_rows_seen(), before, strict=True))
        assert 0 < rows <= 4 * steps
    finally:
        loop.stop()
    for prompt, tokens in zip(PROMPTS, together, strict=True):
        assert tokens == engine.generate(prompt, 12, policy=ENGINE_POLICY).token_ids
