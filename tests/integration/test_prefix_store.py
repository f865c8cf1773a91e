"""The prefill worker's document caches (prefill_svc/prefix_store.py) on real Redis and NATS
servers: keys, single flight, the size cap, TTL refresh on hit, corrupt blobs, a full store."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import replace

import pytest
import redis.asyncio
import torch
from prometheus_client import REGISTRY

from kvstore import open_store
from kvstore.codec import decode_blob, encode_blob
from prefill_svc.prefix_store import BYPASS, HIT, STORED, PrefixStore, PrefixStoreConfig, prefix_key
from serving.worker import blob_spec
from snapstream.policy import CachePolicy
from snapstream.prefix_config import DocumentCacheConfig
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config

POLICY = CachePolicy(n_sink=2, n_topk=12, n_recent=8, window=4, kernel=3)


@pytest.fixture(scope="module")
def engine():
    return engine_for(random_model(tiny_config(), seed=1))


def document(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (length,), generator=generator).tolist()


class Compressor:
    """A document's compression on the engine, counted; ``gate`` holds it until set."""

    def __init__(self, engine, doc_ids: list[int]) -> None:
        self.engine, self.doc_ids, self.calls = engine, doc_ids, 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self):
        self.calls += 1
        await self.gate.wait()
        return self.engine.compress_prefix(self.doc_ids, POLICY, 4)


async def ask(prefixes: PrefixStore, engine, doc_ids: list[int], compressor=None):
    key = prefix_key(prefixes.spec, POLICY, doc_ids)
    return await prefixes.get_or_compress(key, len(doc_ids),
                                          compressor or Compressor(engine, doc_ids))


def test_keys_differ_by_model_policy_dtype_scorer_and_document(engine):
    spec, doc = blob_spec(engine), document(50, 1)
    key = prefix_key(spec, POLICY, doc)
    assert key == prefix_key(spec, POLICY, list(doc))
    others = [
        prefix_key(spec, replace(POLICY, n_topk=13), doc),
        prefix_key(spec, replace(POLICY, n_recent=9), doc),
        prefix_key(spec, replace(POLICY, window=5), doc),
        prefix_key(spec, replace(POLICY, kernel=5), doc),
        prefix_key(spec, replace(POLICY, kind="streaming"), doc),
        prefix_key(replace(spec, fingerprint=bytes(32)), POLICY, doc),
        prefix_key(replace(spec, dtype=torch.bfloat16), POLICY, doc),
        prefix_key(spec, POLICY, doc[:-1]),
        prefix_key(spec, POLICY, [*doc[:-1], doc[-1] + 1]),
        prefix_key(spec, POLICY, doc, DocumentCacheConfig(score="repeat")),
        prefix_key(spec, POLICY, doc, DocumentCacheConfig(score="surprisal")),
        prefix_key(spec, POLICY, doc, DocumentCacheConfig(superset=2)),
    ]
    assert len({key, *others}) == 1 + len(others)


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_concurrent_requests_compress_once(engine, store):
    prefixes = PrefixStore(store, blob_spec(engine), PrefixStoreConfig())
    before = {outcome: metric("snapstream_prefix_cache_total", outcome=outcome)
              for outcome in (STORED, HIT)}
    saved = metric("snapstream_prefix_cache_saved_seconds_total")
    doc = document(60, 2)
    compressor = Compressor(engine, doc)
    compressor.gate.clear()
    first = asyncio.create_task(ask(prefixes, engine, doc, compressor))
    while not prefixes.in_flight:
        await asyncio.sleep(0)
    others = [asyncio.create_task(ask(prefixes, engine, doc, compressor)) for _ in range(3)]
    for _ in range(5):
        await asyncio.sleep(0)  # every other request is now waiting for the first
    compressor.gate.set()
    results = await asyncio.gather(first, *others)
    assert compressor.calls == 1
    assert [outcome for _, outcome in results] == [STORED, HIT, HIT, HIT]
    for cache, _ in results[1:]:
        assert torch.equal(cache.groups[0].k, results[0][0].groups[0].k)
        assert torch.equal(cache.groups[0].positions, results[0][0].groups[0].positions)
    assert metric("snapstream_prefix_cache_total", outcome=STORED) - before[STORED] == 1
    assert metric("snapstream_prefix_cache_total", outcome=HIT) - before[HIT] == 3
    assert metric("snapstream_prefix_cache_bytes") == sum(prefixes.held.values()) > 0
    assert metric("snapstream_prefix_cache_saved_seconds_total") > saved


async def test_requests_arriving_together_compress_once(engine, store):
    """All of them look the document up before any claims it (their lookups overlap)."""
    prefixes = PrefixStore(store, blob_spec(engine), PrefixStoreConfig())
    doc = document(60, 5)
    compressor = Compressor(engine, doc)
    results = await asyncio.gather(*(ask(prefixes, engine, doc, compressor) for _ in range(4)))
    assert compressor.calls == 1
    assert sorted(outcome for _, outcome in results) == [HIT, HIT, HIT, STORED]
    assert not prefixes.in_flight


async def test_a_hit_reads_what_was_stored(engine, store):
    prefixes = PrefixStore(store, blob_spec(engine), PrefixStoreConfig())
    doc = document(70, 3)
    stored, outcome = await ask(prefixes, engine, doc)
    assert outcome == STORED
    again = PrefixStore(store, blob_spec(engine), PrefixStoreConfig())  # another worker
    compressor = Compressor(engine, doc)
    cached, outcome = await ask(again, engine, doc, compressor)
    assert (outcome, compressor.calls) == (HIT, 0)
    (cached_kv,), (stored_kv,) = cached.groups, stored.groups
    assert torch.equal(cached_kv.k, stored_kv.k) and torch.equal(cached_kv.v, stored_kv.v)


def _bad_version(blob: bytearray) -> bytearray:
    struct.pack_into("<H", blob, 8, 99)
    return blob


CORRUPTIONS = {
    "garbage": lambda blob: bytearray(b"not a blob" * 10),
    "payload bit flip": lambda blob: blob[:-1] + bytearray([blob[-1] ^ 1]),
    "truncated": lambda blob: blob[:-100],
    "other version": _bad_version,
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
async def test_a_corrupt_or_mismatched_blob_is_dropped_and_recompressed(engine, store,
                                                                       corruption):
    spec = blob_spec(engine)
    prefixes = PrefixStore(store, spec, PrefixStoreConfig())
    doc = document(80, 4)
    good = engine.compress_prefix(doc, POLICY, 4)
    key = prefix_key(spec, POLICY, doc)
    await store.put(key, CORRUPTIONS[corruption](encode_blob(good, spec)), ttl_s=60)
    compressor = Compressor(engine, doc)
    cache, outcome = await ask(prefixes, engine, doc, compressor)
    assert (outcome, compressor.calls) == (STORED, 1)
    assert torch.equal(cache.groups[0].k, good.groups[0].k)
    fetched = decode_blob(await store.get(key), spec)
    assert torch.equal(fetched.groups[0].k, good.groups[0].k.to(spec.dtype))


async def test_the_size_cap_evicts_the_least_recently_used(engine, store):
    spec = blob_spec(engine)
    size = len(encode_blob(engine.compress_prefix(document(90, 5), POLICY, 4), spec))
    prefixes = PrefixStore(store, spec, PrefixStoreConfig(max_bytes=2 * size))
    docs = [document(90, seed) for seed in (5, 6, 7)]
    keys = [prefix_key(spec, POLICY, doc) for doc in docs]
    assert [(await ask(prefixes, engine, doc))[1] for doc in docs[:2]] == [STORED, STORED]
    assert (await ask(prefixes, engine, docs[0]))[1] == HIT  # now the most recently used
    assert (await ask(prefixes, engine, docs[2]))[1] == STORED
    assert [await store.exists(key) for key in keys] == [True, False, True]
    assert sum(prefixes.held.values()) == 2 * size


async def test_a_document_over_the_cap_is_served_without_caching(engine, store):
    spec = blob_spec(engine)
    prefixes = PrefixStore(store, spec, PrefixStoreConfig(max_bytes=1000))
    doc = document(90, 8)
    cache, outcome = await ask(prefixes, engine, doc)
    assert outcome == BYPASS
    assert cache.prompt_len == 90
    assert await store.keys() == []


async def test_a_hit_refreshes_the_ttl(engine, store):
    spec = blob_spec(engine)
    prefixes = PrefixStore(store, spec, PrefixStoreConfig(ttl_s=3.0))
    used, unused = document(60, 9), document(60, 10)
    for doc in (used, unused):
        assert (await ask(prefixes, engine, doc))[1] == STORED
    await asyncio.sleep(1.7)  # past half the TTL: the hit writes the blob again
    assert (await ask(prefixes, engine, used))[1] == HIT
    await asyncio.sleep(1.7)  # past the first TTL
    assert await store.exists(prefix_key(spec, POLICY, used))
    assert not await store.exists(prefix_key(spec, POLICY, unused))


@pytest.mark.parametrize("backend", ["redis"])
async def test_a_store_without_room_serves_without_caching(engine, own_server):
    async with await open_store(own_server.url) as full, \
            redis.asyncio.from_url(own_server.url) as admin:
        await admin.config_set("maxmemory", "100kb")  # below what it holds: writes get -OOM
        prefixes = PrefixStore(full, blob_spec(engine), PrefixStoreConfig())
        doc = document(90, 11)
        cache, outcome = await ask(prefixes, engine, doc)
        assert outcome == BYPASS
        assert cache.prompt_len == 90
        await admin.config_set("maxmemory", "0")
        for _ in range(100):  # the failed put's chunks are deleted in the background
            if not await admin.keys("*"):
                break
            await asyncio.sleep(0.05)
        assert await admin.keys("*") == []
        assert prefixes.held == {}
