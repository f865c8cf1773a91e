"""The stores over TLS (rediss://, tls://), chunk paths included, against real servers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvstore import StoreUnavailable, new_blob_key, open_store
from tests.integration.conftest import start_server


@pytest.mark.parametrize("kind", ["redis-tls", "nats-tls"])
async def test_a_blob_round_trips_over_tls(tmp_path: Path, kind: str) -> None:
    server = start_server(kind, tmp_path)
    try:
        data = random.Random(0).randbytes(40 * 4096 + 17)  # 41 chunks, pipelined
        async with await open_store(server.url, chunk_size=4096) as store:
            key = new_blob_key()
            await store.put(key, data, ttl_s=60)
            assert await store.get(key) == data
            await store.delete(key)
            assert await store.keys() == []
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["redis-tls", "nats-tls"])
async def test_a_server_certificate_from_another_ca_is_refused(tmp_path: Path,
                                                               kind: str) -> None:
    server = start_server(kind, tmp_path)
    try:
        url = server.url.split("?")[0]  # the system's CAs do not know the test CA
        with pytest.raises(StoreUnavailable, match="unavailable"):
            await open_store(url, connect_timeout_s=2.0)
    finally:
        server.stop()
