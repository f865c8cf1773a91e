"""What a blob store leaves behind when a put is cut short or a delete meets an outage: nothing,
on real Redis and NATS servers."""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

import pytest

from kvstore import BlobStore, new_blob_key, open_store
from kvstore.stores.janitor import RetryPolicy

if TYPE_CHECKING:
    from tests.integration.conftest import Raw, Server

POLL_S, POLLS = 0.05, 600  # up to 30 s: NATS reconnects every 2 s


async def _until(predicate, what: str) -> None:
    for _ in range(POLLS):
        if await predicate():
            return
        await asyncio.sleep(POLL_S)
    raise AssertionError(f"never true: {what}")


async def _empty(raw: Raw) -> bool:
    return await raw.names() == []


async def test_a_put_cancelled_in_the_middle_leaves_nothing(url: str, store_options,
                                                            raw: Raw) -> None:
    """As a client deadline does to a prefill writing its blob: chunks are already stored
    when the cancel strikes."""
    async with await open_store(url, **store_options, chunk_size=64 << 10) as store:
        put = asyncio.ensure_future(store.put(new_blob_key(), random.randbytes(48 << 20),
                                              ttl_s=60))
        await _until(lambda: _has_names(raw, put), "a chunk stored before the put ends")
        assert not put.done(), "the put ended before it could be cut"
        put.cancel()
        with pytest.raises(asyncio.CancelledError):
            await put
        await _until(lambda: _empty(raw), "no manifest and no chunk left")


async def _has_names(raw: Raw, put: asyncio.Future) -> bool:
    return put.done() or bool(await raw.names())


async def test_a_put_that_fails_part_way_leaves_no_chunk(own_server: Server, store_options,
                                                         backend: str) -> None:
    """The server goes away during the put; once it is back, the janitor deletes the chunks
    that were written."""
    from tests.integration.conftest import Raw

    raw = Raw(backend, own_server.url, store_options)
    async with await open_store(own_server.url, **store_options, chunk_size=64 << 10,
                                request_timeout_s=1.0) as store:
        store.janitor.retry = RetryPolicy(first_delay_s=0.2, max_delay_s=1.0)
        put = asyncio.ensure_future(store.put(new_blob_key(), random.randbytes(48 << 20),
                                              ttl_s=60))
        await _until(lambda: _has_names(raw, put), "a chunk stored before the put ends")
        own_server.stop()
        with pytest.raises(Exception):  # noqa: B017 - whichever the lost connection raised
            await put
        own_server.restart()
        if backend == "nats":  # JetStream kept the chunks on disk; Redis lost them anyway
            await _until(lambda: _empty(raw), "the written chunks deleted after the outage")
        await _until(lambda: _no_pending(store), "the janitor done")
        assert await raw.names() == []


async def _has_failed(store: BlobStore) -> bool:
    return store.janitor.failed_attempts > 0


async def _no_pending(store: BlobStore) -> bool:
    return store.janitor.pending == 0


@pytest.mark.parametrize("backend", ["nats"])
async def test_a_delete_during_an_outage_is_retried_when_the_server_returns(
        own_server: Server, store_options, backend: str) -> None:
    """JetStream keeps blobs on disk across a restart: a delete that failed while the server
    was down must not leave the blob to the stream's max_age (an hour)."""
    from tests.integration.conftest import Raw

    raw = Raw(backend, own_server.url, store_options)
    async with await open_store(own_server.url, **store_options, chunk_size=4096,
                                request_timeout_s=0.5) as store:
        store.janitor.retry = RetryPolicy(first_delay_s=0.2, max_delay_s=1.0)
        key = new_blob_key()
        await store.put(key, random.randbytes(5 * 4096), ttl_s=60)
        own_server.stop()
        store.delete_soon(key)
        await _until(lambda: _has_failed(store), "a delete attempt failed")
        own_server.restart()
        await _until(lambda: _empty(raw), "the blob deleted once the server is back")
