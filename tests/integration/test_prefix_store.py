"""The prefill worker's document caches (prefill_svc/prefix_store.py) on real Redis and NATS
servers: namespaced keys, single flight, caps counted in the store's ledger (shared by every
worker, fair between tenants), TTL refresh on hit, blobs that fail their MAC or checks, a full
store."""

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
from kvstore.seal import ClusterSecret, Seal, tokens_digest
from prefill_svc.prefix_store import (
    BYPASS,
    HIT,
    OVER_CAP,
    STORE_FULL,
    STORED,
    Document,
    PrefixOutcome,
    PrefixStore,
    PrefixStoreConfig,
    namespace_of,
    prefix_key,
)
from serving.worker import blob_spec
from snapstream.policy import CachePolicy
from snapstream.prefix_config import DocumentCacheConfig
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config

POLICY = CachePolicy(n_sink=2, n_topk=12, n_recent=8, observation=4, kernel=3)
SECRET = ClusterSecret(b"the test cluster's secret")


@pytest.fixture(scope="module")
def engine():
    return engine_for(random_model(tiny_config(), seed=1))


def document(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (length,), generator=generator).tolist()


def prefixes_on(store, engine, **config) -> PrefixStore:
    """A prefill worker's document caches (another call: another worker on the same store)."""
    return PrefixStore(store, blob_spec(engine), SECRET, PrefixStoreConfig(**config))


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


def doc_of(prefixes: PrefixStore, doc_ids: list[int], tenant: str = "default",
           salt: str = "") -> Document:
    key = prefix_key(prefixes.spec, POLICY, doc_ids, namespace=namespace_of(tenant, salt))
    return Document(key, tenant, tuple(doc_ids))


def no_problem(cache) -> None:
    return None


async def ask(prefixes: PrefixStore, engine, doc_ids: list[int], compressor=None,
              tenant: str = "default", check=no_problem) -> tuple:
    """-> (cache, outcome state)"""
    cache, outcome = await prefixes.get_or_compress(
        doc_of(prefixes, doc_ids, tenant), compressor or Compressor(engine, doc_ids), check)
    return cache, outcome.state


def test_keys_differ_by_namespace_model_policy_dtype_scorer_and_document(engine):
    spec, doc = blob_spec(engine), document(50, 1)
    key = prefix_key(spec, POLICY, doc)
    assert key == prefix_key(spec, POLICY, list(doc))
    others = [
        prefix_key(spec, POLICY, doc, namespace=namespace_of("a", "")),
        prefix_key(spec, POLICY, doc, namespace=namespace_of("b", "")),
        prefix_key(spec, POLICY, doc, namespace=namespace_of("a", "salt")),
        prefix_key(spec, POLICY, doc, namespace=namespace_of("a\0", "")),  # no way to collide
        prefix_key(spec, replace(POLICY, n_topk=13), doc),
        prefix_key(spec, replace(POLICY, n_recent=9), doc),
        prefix_key(spec, replace(POLICY, observation=5), doc),
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
    prefixes = prefixes_on(store, engine)
    tenant = "concurrent"
    before = {outcome: metric("snapstream_prefix_cache_total", outcome=outcome, tenant=tenant)
              for outcome in (STORED, HIT)}
    saved = metric("snapstream_prefix_cache_saved_seconds_total")
    doc = document(60, 2)
    compressor = Compressor(engine, doc)
    compressor.gate.clear()
    first = asyncio.create_task(ask(prefixes, engine, doc, compressor, tenant))
    while not prefixes.in_flight:
        await asyncio.sleep(0)
    others = [asyncio.create_task(ask(prefixes, engine, doc, compressor, tenant))
              for _ in range(3)]
    for _ in range(5):
        await asyncio.sleep(0)  # every other request is now waiting for the first
    compressor.gate.set()
    results = await asyncio.gather(first, *others)
    assert compressor.calls == 1
    assert [outcome for _, outcome in results] == [STORED, HIT, HIT, HIT]
    for cache, _ in results[1:]:
        assert torch.equal(cache.groups[0].k, results[0][0].groups[0].k)
        assert torch.equal(cache.groups[0].positions, results[0][0].groups[0].positions)
    assert metric("snapstream_prefix_cache_total", outcome=STORED, tenant=tenant) \
        - before[STORED] == 1
    assert metric("snapstream_prefix_cache_total", outcome=HIT, tenant=tenant) \
        - before[HIT] == 3
    stored_bytes = len(await store.get(doc_of(prefixes, doc, tenant).key))
    assert metric("snapstream_prefix_cache_bytes", tenant=tenant) == stored_bytes
    assert metric("snapstream_prefix_cache_saved_seconds_total") > saved


async def test_requests_arriving_together_compress_once(engine, store):
    """All of them look the document up before any claims it (their lookups overlap)."""
    prefixes = prefixes_on(store, engine)
    doc = document(60, 5)
    compressor = Compressor(engine, doc)
    results = await asyncio.gather(*(ask(prefixes, engine, doc, compressor) for _ in range(4)))
    assert compressor.calls == 1
    assert sorted(outcome for _, outcome in results) == [HIT, HIT, HIT, STORED]
    assert not prefixes.in_flight


async def test_a_document_over_the_cap_is_compressed_once_and_served_without_caching(
        engine, store):
    prefixes = prefixes_on(store, engine, max_bytes=1000)
    doc = document(90, 8)
    compressor = Compressor(engine, doc)
    compressor.gate.clear()

    def asking() -> asyncio.Task:
        return asyncio.create_task(prefixes.get_or_compress(doc_of(prefixes, doc), compressor,
                                                            no_problem))

    first = asking()
    while not prefixes.in_flight:
        await asyncio.sleep(0)
    others = [asking() for _ in range(2)]  # they find it in flight and wait for it
    for _ in range(5):
        await asyncio.sleep(0)
    compressor.gate.set()
    results = await asyncio.gather(first, *others)
    assert compressor.calls == 1
    assert {outcome for _, outcome in results} == {PrefixOutcome(BYPASS, OVER_CAP)}
    assert all(cache.prompt_len == 90 for cache, _ in results)
    assert await store.keys() == []


async def test_a_hit_reads_what_another_worker_stored(engine, store):
    doc = document(70, 3)
    stored, outcome = await ask(prefixes_on(store, engine), engine, doc)
    assert outcome == STORED
    again = prefixes_on(store, engine)  # another worker
    compressor = Compressor(engine, doc)
    cached, outcome = await ask(again, engine, doc, compressor)
    assert (outcome, compressor.calls) == (HIT, 0)
    (cached_kv,), (stored_kv,) = cached.groups, stored.groups
    assert torch.equal(cached_kv.k, stored_kv.k) and torch.equal(cached_kv.v, stored_kv.v)


async def test_each_tenant_and_salt_has_its_own_documents(engine, store):
    prefixes = prefixes_on(store, engine)
    doc = document(50, 12)
    assert (await ask(prefixes, engine, doc, tenant="alice"))[1] == STORED
    assert (await ask(prefixes, engine, doc, tenant="bob"))[1] == STORED
    assert (await ask(prefixes, engine, doc, tenant="alice"))[1] == HIT
    salted = doc_of(prefixes, doc, "alice", "project-x")
    _, outcome = await prefixes.get_or_compress(salted, Compressor(engine, doc), no_problem)
    assert outcome.state == STORED


def _bad_version(blob: bytearray) -> bytearray:
    struct.pack_into("<H", blob, 8, 99)
    return blob


CORRUPTIONS = {
    "garbage": lambda blob, key, doc: bytearray(b"not a blob" * 10),
    "payload bit flip": lambda blob, key, doc: blob[:-1] + bytearray([blob[-1] ^ 1]),
    "truncated": lambda blob, key, doc: blob[:-100],
    "other version": lambda blob, key, doc: _bad_version(blob),
}


def _resealed(engine, key: str, seal: Seal) -> bytearray:
    return encode_blob(engine.compress_prefix(document(80, 4), POLICY, 4), blob_spec(engine),
                       seal)


# blobs sealed by someone else: with the store's password alone, of another document, or moved
# from another key
FORGERIES = {
    "another secret": lambda engine, key, doc: _resealed(
        engine, key, Seal(ClusterSecret(b"the store's password"), key, tokens_digest(doc))),
    "other tokens": lambda engine, key, doc: _resealed(
        engine, key, Seal(SECRET, key, tokens_digest(document(80, 99)))),
    "moved from another key": lambda engine, key, doc: _resealed(
        engine, key, Seal(SECRET, "prefix-popular", tokens_digest(doc))),
}


@pytest.mark.parametrize("damage", [*CORRUPTIONS, *FORGERIES])
async def test_a_blob_that_fails_its_checks_is_dropped_and_recompressed(engine, store, damage):
    prefixes = prefixes_on(store, engine)
    spec, doc = blob_spec(engine), document(80, 4)
    good = engine.compress_prefix(doc, POLICY, 4)
    key = doc_of(prefixes, doc).key
    seal = Seal(SECRET, key, tokens_digest(doc))
    bad = (CORRUPTIONS[damage](encode_blob(good, spec, seal), key, doc) if damage in CORRUPTIONS
           else FORGERIES[damage](engine, key, doc))
    await store.put(key, bad, ttl_s=60)
    compressor = Compressor(engine, doc)
    cache, outcome = await ask(prefixes, engine, doc, compressor)
    assert (outcome, compressor.calls) == (STORED, 1)
    assert torch.equal(cache.groups[0].k, good.groups[0].k)
    fetched = decode_blob(await store.get(key), spec, seal)
    assert torch.equal(fetched.groups[0].k, good.groups[0].k.to(spec.dtype))


async def test_a_stored_cache_of_another_layout_is_dropped_and_recompressed(engine, store):
    prefixes = prefixes_on(store, engine)
    doc = document(80, 13)
    assert (await ask(prefixes, engine, doc))[1] == STORED
    compressor = Compressor(engine, doc)
    _, outcome = await ask(prefixes, engine, doc, compressor, check=lambda cache: "not mine")
    assert (outcome, compressor.calls) == (STORED, 1)


async def test_the_cap_counts_every_workers_documents_and_evicts_the_least_recently_used(
        engine, store):
    spec, seal = blob_spec(engine), Seal(SECRET, "k")
    size = len(encode_blob(engine.compress_prefix(document(90, 5), POLICY, 4), spec, seal))
    workers = [prefixes_on(store, engine, max_bytes=2 * size) for _ in range(2)]
    docs = [document(90, seed) for seed in (5, 6, 7)]
    keys = [doc_of(workers[0], doc).key for doc in docs]
    assert (await ask(workers[0], engine, docs[0]))[1] == STORED
    assert (await ask(workers[1], engine, docs[1]))[1] == STORED
    assert (await ask(workers[1], engine, docs[0]))[1] == HIT  # now the most recently used
    restarted = prefixes_on(store, engine, max_bytes=2 * size)  # knows only the store
    assert (await ask(restarted, engine, docs[2]))[1] == STORED
    assert [await store.exists(key) for key in keys] == [True, False, True]
    assert restarted.ledger.usage["default"] == 2 * size


async def test_a_tenant_filling_the_cache_evicts_its_own_documents_first(engine, store):
    spec, seal = blob_spec(engine), Seal(SECRET, "k")
    size = len(encode_blob(engine.compress_prefix(document(90, 5), POLICY, 4), spec, seal))
    prefixes = prefixes_on(store, engine, max_bytes=3 * size)
    alices = document(90, 20)
    assert (await ask(prefixes, engine, alices, tenant="alice"))[1] == STORED
    fillers = [document(90, seed) for seed in range(21, 26)]
    for filler in fillers:
        assert (await ask(prefixes, engine, filler, tenant="mallory"))[1] == STORED
    assert await store.exists(doc_of(prefixes, alices, "alice").key)
    assert (await ask(prefixes, engine, alices, tenant="alice"))[1] == HIT
    assert prefixes.ledger.usage == {"alice": size, "mallory": 2 * size}


async def test_a_tenants_own_cap_evicts_only_its_documents(engine, store):
    spec, seal = blob_spec(engine), Seal(SECRET, "k")
    size = len(encode_blob(engine.compress_prefix(document(90, 5), POLICY, 4), spec, seal))
    prefixes = prefixes_on(store, engine, max_bytes=10 * size, tenant_max_bytes=size)
    first, second = document(90, 30), document(90, 31)
    assert (await ask(prefixes, engine, first, tenant="alice"))[1] == STORED
    assert (await ask(prefixes, engine, first, tenant="bob"))[1] == STORED
    assert (await ask(prefixes, engine, second, tenant="alice"))[1] == STORED
    assert not await store.exists(doc_of(prefixes, first, "alice").key)
    assert await store.exists(doc_of(prefixes, first, "bob").key)


async def test_a_hit_refreshes_the_ttl(engine, store):
    prefixes = prefixes_on(store, engine, ttl_s=3.0)
    used, unused = document(60, 9), document(60, 10)
    for doc in (used, unused):
        assert (await ask(prefixes, engine, doc))[1] == STORED
    await asyncio.sleep(1.7)  # past half the TTL: the hit writes the blob again
    assert (await ask(prefixes, engine, used))[1] == HIT
    await asyncio.sleep(1.7)  # past the first TTL
    assert await store.exists(doc_of(prefixes, used).key)
    assert not await store.exists(doc_of(prefixes, unused).key)


@pytest.mark.parametrize("backend", ["redis"])
async def test_a_store_without_room_serves_without_caching(engine, own_server):
    async with await open_store(own_server.url) as full, \
            redis.asyncio.from_url(own_server.url) as admin:
        prefixes = prefixes_on(full, engine)
        await admin.config_set("maxmemory", "100kb")  # below what it holds: writes get -OOM
        doc = document(90, 11)
        cache, outcome = await prefixes.get_or_compress(doc_of(prefixes, doc),
                                                        Compressor(engine, doc), no_problem)
        assert outcome == PrefixOutcome(BYPASS, STORE_FULL)
        assert cache.prompt_len == 90
        await admin.config_set("maxmemory", "0")
        for _ in range(100):  # the failed put's chunks are deleted in the background
            if not await full.keys():
                break
            await asyncio.sleep(0.05)
        assert await full.keys() == []
        assert sum(prefixes.ledger.usage.values()) == 0
