"""A decode worker makes a pool for a new cache layout only where it fits beside the pools it
keeps, under its memory limit; what does not fit ends that request alone, RESOURCE_EXHAUSTED."""

from __future__ import annotations

import grpc
import pytest

from decode_svc.backends import BackendConfig, make_backend
from decode_svc.loop import DecodeLoop
from serving.errors import status_for
from snapstream.memory import MemoryExhausted
from snapstream.memory_plan import GIB, DecodeMemory
from snapstream.policy import CachePolicy
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config

ENGINE = engine_for(random_model(tiny_config()))
SMALL, LARGE = (ENGINE.model_layout(CachePolicy(n_sink=4, n_topk=topk, n_recent=16,
                                                observation=8).layout(200, 8))
                for topk in (24, 96))


@pytest.fixture(scope="module")
def engine():
    return ENGINE


def loop_with_room_for(engine, *layouts) -> DecodeLoop:
    loop = DecodeLoop(engine, make_backend(BackendConfig(), engine.config), rows=4,
                      max_queue=4)
    room = sum(loop._pool_bytes(layout) for layout in layouts)
    loop.memory = DecodeMemory(limit=GIB + room, weights=GIB // 4, held=GIB)
    return loop


def test_a_pool_that_fits_is_made_and_one_that_does_not_is_refused(engine):
    loop = loop_with_room_for(engine, SMALL)
    assert loop._pool_for(SMALL) is not None
    with pytest.raises(MemoryExhausted, match=r"decode pool of .* does not fit") as info:
        loop._pool_for(LARGE)
    assert status_for(info.value) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert set(loop.pools) == {SMALL}
    assert loop._pool_for(SMALL) is loop.pools[SMALL]  # the one it keeps serves on


def test_pools_are_counted_in_bytes(engine):
    loop = loop_with_room_for(engine, SMALL, LARGE)
    assert loop._pool_bytes(LARGE) > loop._pool_bytes(SMALL) > 0
    assert loop._pool_for(SMALL) is not None and loop._pool_for(LARGE) is not None


def test_a_workers_memory_is_logged_and_exported_by_component(caplog):
    from prometheus_client import REGISTRY

    from serving.metrics import report_memory

    with caplog.at_level("INFO", logger="serving.metrics"):
        report_memory({"weights": 3 << 20, "max_prompt_tokens": 2048})
    assert "weights 3 MiB" in caplog.text and "max_prompt_tokens 2,048" in caplog.text
    sample = REGISTRY.get_sample_value("snapstream_memory_bytes", {"component": "weights"})
    assert sample == 3 << 20
