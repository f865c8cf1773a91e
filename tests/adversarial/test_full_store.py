"""A store that fills: the local store servers hold at most their limit, a document the store
has no room for is served without caching (``bypass``, with the reason in ``usage``), an
ordinary request answers 429 with a retry hint, nothing answers 500, and the cluster serves
again once room is made; on real Redis and NATS servers that refuse writes past their limit."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import redis.asyncio

from kvstore import BlobStore, StoreFull, new_blob_key, open_store
from tests.adversarial.conftest import Keyed, keyed_stack
from tests.integration.conftest import start_server

pytestmark = pytest.mark.asyncio(loop_scope="function")
EXTENSION = {"policy": "snapstream", "n_sink": 4, "n_topk": 40, "n_recent": 24, "observation": 8}
DOCUMENT = " ".join(f"Item {i} costs {i * 37 % 1000} coins." for i in range(80))
BACKENDS = ["redis", "nats"]
# room for a request's blob (36 KB) beside what the store's clients take of a Redis server's
# memory (their buffers), not for the document's (about 1 MB: it is stored whole)
ROOM_BYTES = 768 << 10


@contextlib.asynccontextmanager
async def small_store(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    """A store server with ROOM_BYTES of room, as `snapstream up` limits it (Redis: maxmemory
    without eviction, set above what it holds; NATS: the blob stream's max_bytes, in the URL
    every process opens it with) -> its URL."""
    server = start_server(backend, tmp_path)
    try:
        if backend == "nats":
            yield f"{server.url}?max_bytes={ROOM_BYTES}"
            return
        async with redis.asyncio.from_url(server.url) as admin:
            used = int((await admin.info("memory"))["used_memory"])
            await admin.config_set("maxmemory", str(used + ROOM_BYTES))
            await admin.config_set("maxmemory-policy", "noeviction")
        yield server.url
    finally:
        server.stop()


async def ask_document(keyed: Keyed) -> dict:
    response = await keyed.client("alice").chat.completions.create(
        model=keyed.model, max_tokens=4, temperature=0,
        messages=[{"role": "system", "content": DOCUMENT}, {"role": "user", "content": "Q?"}],
        extra_body={"snapstream": {"cache_prefix": "system", **EXTENSION}})
    return response.usage.model_dump()["snapstream"]


async def fill(store: BlobStore) -> list[str]:
    """Puts blobs, smaller and smaller, until the store refuses even a small one: -> their
    keys."""
    keys = []
    for size in (64 << 10, 4 << 10, 512):
        while True:
            key = new_blob_key()
            try:
                await store.put(key, random.randbytes(size), ttl_s=600)
            except StoreFull:
                break
            keys.append(key)
    return keys


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_document_without_room_is_served_uncached_with_the_reason(
        tiny_model_dir, tmp_path, backend):
    async with small_store(backend, tmp_path) as url, keyed_stack(tiny_model_dir, url) as keyed:
        first, again = await ask_document(keyed), await ask_document(keyed)
    expected = {"prefix_cache": "bypass", "prefix_cache_reason": "store_full"}
    assert first == expected and again == expected


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_full_store_answers_429_with_a_retry_hint_then_serves_again(
        tiny_model_dir, tmp_path, backend):
    async with small_store(backend, tmp_path) as url, \
            keyed_stack(tiny_model_dir, url) as keyed, await open_store(url) as store:
        filler = await fill(store)
        client = keyed.client("bob")
        with pytest.raises(openai.RateLimitError) as err:
            await client.completions.create(model=keyed.model, prompt="x " * 200, max_tokens=4,
                                            extra_body={"snapstream": EXTENSION})
        assert "is full" in err.value.message
        assert err.value.response.headers["retry-after"]
        with pytest.raises(openai.RateLimitError):  # a document request too: its own blob
            await ask_document(keyed)
        for key in filler:
            await store.delete(key)
        answer = await client.completions.create(model=keyed.model, prompt="x " * 200,
                                                 max_tokens=4,
                                                 extra_body={"snapstream": EXTENSION})
        assert answer.usage.completion_tokens >= 1
