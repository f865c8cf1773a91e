"""Blob stores against real Redis and NATS JetStream servers (no mocks)."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio

from kvstore import (
    BlobNotFound,
    BlobStore,
    StoreCorrupted,
    StoreFull,
    StoreUnavailable,
    new_blob_key,
    open_store,
)
from tests.integration.conftest import start_server

if TYPE_CHECKING:
    from pathlib import Path

    from tests.integration.conftest import Raw, Server

MiB = 1 << 20
NewNamespace = Callable[..., dict[str, Any]]


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


SIZES: dict[str, Callable[[int], int]] = {
    "empty": lambda chunk: 0,
    "1KiB": lambda chunk: 1024,
    "chunk-1": lambda chunk: chunk - 1,
    "chunk": lambda chunk: chunk,
    "chunk+1": lambda chunk: chunk + 1,
    "3chunks+17": lambda chunk: 3 * chunk + 17,
    "40MiB": lambda chunk: 40 * MiB,
}


@pytest.mark.parametrize("size_of", SIZES.values(), ids=SIZES.keys())
async def test_round_trip_is_bit_exact_around_chunk_boundaries(
        store: BlobStore, size_of: Callable[[int], int]) -> None:
    data = payload(size_of(store.chunk_size))
    key = new_blob_key()
    await store.put(key, memoryview(data), ttl_s=60)
    assert await store.get(key) == data
    assert await store.keys() == [key]


async def test_default_chunk_fits_one_message(store: BlobStore, backend: str) -> None:
    assert store.chunk_size == {"redis": 8 * MiB, "nats": 1 * MiB}[backend]


async def test_layout_matches_the_docs(store: BlobStore, raw: Raw) -> None:
    key = new_blob_key()
    await store.put(key, bytearray(payload(2 * store.chunk_size + 5)), ttl_s=60)
    manifest = json.loads(await raw.get(raw.manifest_name(key)))
    assert manifest["size"] == 2 * store.chunk_size + 5
    chunks = [raw.chunk_name(key, manifest["put_id"], index) for index in range(3)]
    assert await raw.names() == sorted([raw.manifest_name(key), *chunks])


async def test_reader_with_other_chunk_size_reads_blob(url: str, backend: str,
                                                      new_namespace: NewNamespace) -> None:
    options = new_namespace(backend)
    key, data = new_blob_key(), payload(300_000)
    async with await open_store(url, **options, chunk_size=64 * 1024) as writer:
        await writer.put(key, data, ttl_s=60)
        async with await open_store(url, **options, chunk_size=100_000) as reader:
            assert await reader.get(key) == data
        await writer.delete(key)


async def test_missing_key_raises_blob_not_found(store: BlobStore) -> None:
    with pytest.raises(BlobNotFound, match="never-written"):
        await store.get("never-written")
    assert not await store.exists("never-written")


async def test_delete_after_consume_leaves_nothing(store: BlobStore, raw: Raw) -> None:
    key, data = new_blob_key(), payload(3 * store.chunk_size)
    await store.put(key, data, ttl_s=60)
    assert await store.exists(key)
    assert await store.get(key) == data
    await store.delete(key)
    with pytest.raises(BlobNotFound, match=key):
        await store.get(key)
    assert await raw.names() == []
    await store.delete(key)  # idempotent


async def test_delete_soon_outlives_its_cancelled_caller(store: BlobStore, raw: Raw) -> None:
    key = new_blob_key()
    await store.put(key, payload(3 * store.chunk_size), ttl_s=60)

    async def cancelled_request() -> None:
        store.delete_soon(key)
        await asyncio.sleep(60)

    request = asyncio.ensure_future(cancelled_request())
    await asyncio.sleep(0)  # the request starts, asks for the delete, and waits
    request.cancel()
    for _ in range(200):
        if not await raw.names():
            break
        await asyncio.sleep(0.01)
    assert request.cancelled()
    assert await raw.names() == []


async def test_blob_expires_after_ttl_and_leaves_nothing(store: BlobStore, raw: Raw) -> None:
    key, data = new_blob_key(), payload(2 * store.chunk_size + 1)
    await store.put(key, data, ttl_s=1.0)
    assert await store.get(key) == data
    await asyncio.sleep(1.1)
    with pytest.raises(BlobNotFound, match=key):
        await store.get(key)
    assert not await store.exists(key)
    assert await raw.names() == []


async def test_put_replaces_and_leaves_first_put_to_expire(store: BlobStore) -> None:
    key = new_blob_key()
    await store.put(key, payload(1000, seed=1), ttl_s=60)
    await store.put(key, payload(2000, seed=2), ttl_s=60)
    assert await store.get(key) == payload(2000, seed=2)


async def test_reader_sees_nothing_or_the_whole_blob(url: str, backend: str,
                                                     new_namespace: NewNamespace) -> None:
    """Reads started all along a put see no blob or the whole one; along a put over an existing
    key they see the old blob until the new one is complete: never a mix, never a gap."""
    options = new_namespace(backend, chunk_size=16 * 1024)
    key, first, second = new_blob_key(), payload(MiB, seed=1), payload(MiB, seed=2)
    names = {first: "first", second: "second"}
    async with await open_store(url, **options) as writer, \
            await open_store(url, **options) as reader:

        async def read() -> str:
            try:
                return names.get(bytes(await reader.get(key)), "MIXED")
            except BlobNotFound:
                return "none"

        async def outcomes_during(data: bytes) -> set[str]:
            put = asyncio.create_task(writer.put(key, data, ttl_s=60))
            reads = []
            while not put.done():
                reads.append(asyncio.create_task(read()))
                await asyncio.sleep(0.002)
            await put
            return set(await asyncio.gather(*reads))

        assert "none" in await outcomes_during(first) <= {"none", "first"}
        assert await reader.get(key) == first
        assert "first" in await outcomes_during(second) <= {"first", "second"}
        assert await reader.get(key) == second
        await writer.delete(key)


async def test_tampered_chunk_is_detected(store: BlobStore, raw: Raw, backend: str) -> None:
    key, data = new_blob_key(), payload(2 * store.chunk_size)
    await store.put(key, data, ttl_s=60)
    put_id = json.loads(await raw.get(raw.manifest_name(key)))["put_id"]
    chunk = raw.chunk_name(key, put_id, 1)
    await raw.set(chunk, bytes(store.chunk_size))
    with pytest.raises(StoreCorrupted, match="checksum"):
        await store.get(key)
    longer = (bytes(store.chunk_size + 100),) if backend == "redis" else ()  # NATS: > max_payload
    for wrong_size in (b"short", *longer):
        await raw.set(chunk, wrong_size)
        with pytest.raises(StoreCorrupted, match="have sizes"):
            await store.get(key)
    await raw.set(chunk, data[store.chunk_size:])  # the store's connections are still in step
    assert await store.get(key) == data


async def test_a_chunk_gone_under_its_manifest_is_not_found(store: BlobStore, raw: Raw) -> None:
    """A chunk that expired or was deleted while the manifest still stands: the reader gets
    BlobNotFound naming the chunk, never part of the blob, and the store keeps serving."""
    key, data = new_blob_key(), payload(3 * store.chunk_size)
    await store.put(key, data, ttl_s=60)
    put_id = json.loads(await raw.get(raw.manifest_name(key)))["put_id"]
    await raw.delete(raw.chunk_name(key, put_id, 1))
    with pytest.raises(BlobNotFound, match="chunk 1 expired or deleted"):
        await store.get(key)
    other = new_blob_key()
    await store.put(other, data, ttl_s=60)
    assert await store.get(other) == data


async def test_unreadable_manifest_is_corruption(store: BlobStore, raw: Raw) -> None:
    key = new_blob_key()
    await store.put(key, b"x", ttl_s=60)
    await raw.set(raw.manifest_name(key), b"not json")
    with pytest.raises(StoreCorrupted, match="manifest"):
        await store.get(key)


@pytest.mark.parametrize(("bad", "message"), [
    ({"key": "has space"}, "blob key"),
    ({"key": "a.b"}, "blob key"),
    ({"key": ""}, "blob key"),
    ({"ttl_s": 0}, "ttl_s"),
    ({"ttl_s": -1}, "ttl_s"),
])
async def test_bad_put_arguments_raise_value_error(
        store: BlobStore, bad: dict[str, Any], message: str) -> None:
    arguments = {"key": new_blob_key(), "data": b"x", "ttl_s": 10} | bad
    with pytest.raises(ValueError, match=message):
        await store.put(**arguments)


def test_new_blob_keys_are_unguessable() -> None:
    keys = {new_blob_key() for _ in range(1000)}
    assert len(keys) == 1000
    assert all(len(key) == 32 for key in keys)


async def test_unknown_scheme_names_it() -> None:
    with pytest.raises(ValueError, match=r"'memcached'.*redis://"):
        await open_store("memcached://127.0.0.1:11211")


@pytest.mark.parametrize("scheme", ["redis", "nats"])
async def test_unreachable_server_is_unavailable_naming_url(scheme: str, unused_port: int) -> None:
    url = f"{scheme}://user:secret@127.0.0.1:{unused_port}"
    with pytest.raises(StoreUnavailable, match=f"{scheme}://user:\\*\\*\\*@127.0.0.1") as info:
        await open_store(url, connect_timeout_s=1.0)
    assert "secret" not in str(info.value)


async def test_lost_server_is_unavailable_naming_url(own_server: Server, backend: str) -> None:
    async with await open_store(own_server.url, request_timeout_s=0.5,
                                chunk_size=4096) as store:
        key = new_blob_key()
        await store.put(key, b"x", ttl_s=60)
        own_server.stop()
        operations = [lambda: store.get(key), lambda: store.put(key, b"y", ttl_s=60),
                      lambda: store.put(key, payload(40 * 4096), ttl_s=60),  # many round trips
                      lambda: store.delete(key)]
        for operation in operations:
            with pytest.raises(StoreUnavailable, match=re.escape(own_server.url)):
                await operation()


@pytest.mark.parametrize("backend", ["redis"])
async def test_a_restarted_redis_serves_the_next_call(own_server: Server) -> None:
    """The client's pooled connections die with the server; the next call reconnects."""
    async with await open_store(own_server.url) as store:
        await store.put(new_blob_key(), b"x", ttl_s=60)
        own_server.restart()
        key = new_blob_key()
        await store.put(key, b"after", ttl_s=60)
        assert await store.get(key) == b"after"


@pytest.mark.parametrize("user", ["", "default"])
async def test_redis_password_and_database_reach_the_chunk_connections(
        tmp_path: Path, user: str) -> None:
    """Chunks move over the store's own connections: they must log in and select the URL's
    database as redis-py does for the manifest."""
    server = start_server("redis-password", tmp_path)
    try:
        url = server.url.replace(":s3cret@", f"{user}:s3cret@").removesuffix("/0") + "/3"
        data = payload(5 * 4096 + 17)
        async with await open_store(url, chunk_size=4096) as store:
            key = new_blob_key()
            await store.put(key, data, ttl_s=60)
            assert await store.get(key) == data
        db3, db0 = (redis.asyncio.from_url(url.removesuffix("/3") + f"/{db}") for db in (3, 0))
        async with db3, db0:
            assert len(await db3.keys("snapstream:chunk:*")) == 6
            assert await db0.keys("*") == []
    finally:
        server.stop()


@pytest.mark.parametrize("backend", ["redis"])
async def test_redis_refusing_a_chunk_for_room_is_full_and_leaves_no_blob(
        own_server: Server) -> None:
    async with await open_store(own_server.url, chunk_size=MiB) as store, \
            redis.asyncio.from_url(own_server.url) as admin:
        await admin.config_set("maxmemory", "1mb")  # noeviction: writes get -OOM
        key = new_blob_key()
        with pytest.raises(StoreFull, match=f"{re.escape(own_server.url)} is full.*OOM"):
            await store.put(key, payload(4 * MiB), ttl_s=60)
        assert await store.keys() == []
        await admin.config_set("maxmemory", "0")
        await store.put(key, b"after", ttl_s=60)  # the refused connections were not reused
        assert await store.get(key) == b"after"


@pytest.mark.parametrize("kind", ["nats-password", "nats-token"])
async def test_nats_credentials_reach_the_chunk_connections(tmp_path: Path, kind: str) -> None:
    """Chunks are read over the store's own connections: they must log in as nats-py does."""
    server = start_server(kind, tmp_path)
    try:
        data = payload(20 * 4096 + 17)
        async with await open_store(server.url, chunk_size=4096) as store:
            key = new_blob_key()
            await store.put(key, data, ttl_s=60)
            assert await store.get(key) == data
    finally:
        server.stop()


async def test_nats_ttl_is_bounded_by_stream_max_age(nats_url: str,
                                                     new_namespace: NewNamespace) -> None:
    options = new_namespace("nats", max_ttl_s=5.0)
    async with await open_store(nats_url, **options) as store:
        with pytest.raises(ValueError, match="max_ttl_s"):
            await store.put(new_blob_key(), b"x", ttl_s=6.0)
    with pytest.raises(ValueError, match="another configuration"):
        await open_store(nats_url, **options | {"max_ttl_s": 10.0})


async def test_nats_chunk_must_fit_max_payload(nats_url: str,
                                               new_namespace: NewNamespace) -> None:
    with pytest.raises(ValueError, match="max_payload"):
        await open_store(nats_url, **new_namespace("nats", chunk_size=2 * MiB))


async def test_nats_without_jetstream_is_unavailable(plain_nats_url: str) -> None:
    with pytest.raises(StoreUnavailable, match="-js"):
        await open_store(plain_nats_url, connect_timeout_s=2.0)


@pytest.mark.slow
async def test_one_gibibyte_round_trip(store: BlobStore) -> None:
    data = bytes(range(256)) * (4 * MiB)  # 1 GiB
    key = new_blob_key()
    await store.put(key, data, ttl_s=300)
    assert await store.get(key) == data
    await store.delete(key)
