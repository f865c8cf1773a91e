"""A prefill worker's document caches in the KV store (compress once, ask many).

A document's cache (``snapstream.prefix_cache``) is stored as a sealed KV blob (the codec's
header, model fingerprint and MAC under the cluster secret, bound to its key and to the
document's tokens) under a key derived from everything that shapes it and from whose it is:
:func:`prefix_key`. Lookups and stores go through :class:`PrefixStore`:

- **namespaced**: the key hashes the caller's tenant and cache salt, so a request only ever
  finds, waits for or hears of documents of its own namespace;
- **single flight**: concurrent requests for one document on this worker compress it once and
  all use that cache, stored or not (across workers each compresses it once, the last put wins);
- **accounted in the store**: the ledger (:mod:`prefill_svc.doc_ledger`) counts every worker's
  documents against the cache's caps, in total and per tenant, and picks what a new document
  evicts; a document larger than a cap, or one the store refuses (full, unavailable), is
  served without caching: ``bypass``, with the reason;
- **TTL refreshed on hit**: a hit re-puts the blob once less than half its TTL is left, so a
  document in use stays while one unused expires;
- **never served unchecked**: a blob that fails its MAC, the codec's checks, the document's
  token count and digest, or the layout the request's policy expects is deleted and the
  document compressed again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass

from kvstore import BlobStore
from kvstore.blob_errors import BlobError
from kvstore.codec import BlobSpec, decode_blob, encode_blob
from kvstore.seal import ClusterSecret, Seal, tokens_digest
from kvstore.stores.errors import BlobNotFound, StoreCorrupted, StoreError, StoreFull
from prefill_svc.doc_ledger import Ledger, LedgerLimits
from serving import metrics
from snapstream.kvcache import SequenceCache
from snapstream.policy import CachePolicy
from snapstream.prefix_config import DEFAULT_DOCUMENT_CACHE, DocumentCacheConfig

log = logging.getLogger(__name__)

PREFIX_FORMAT = 6  # the stored cache's meaning: a change makes new keys (5: fp8 rows hold each
# row's Hadamard transform; 6: keys namespaced by tenant and salt, blobs sealed)
KEY_PREFIX = "prefix-"  # of every document's store key (request blobs have random keys)
STORED, HIT, BYPASS = "stored", "hit", "bypass"
# why a document was served without caching
OVER_CAP, STORE_FULL, STORE_UNAVAILABLE = "over_cap", "store_full", "store_unavailable"


def prefix_key(spec: BlobSpec, policy: CachePolicy, doc_ids: Sequence[int],
               document: DocumentCacheConfig = DEFAULT_DOCUMENT_CACHE,
               namespace: str = "") -> str:
    """The store key of a document's cache: a SHA-256 of the prefix format, the namespace
    (:func:`namespace_of`), the model (fingerprint, shapes, KV dtype), every field of the policy
    and of the worker's document cache config (scorer, superset) and the document's token
    ids."""
    digest = hashlib.sha256(f"snapstream-prefix/{PREFIX_FORMAT}\0".encode())
    digest.update(json.dumps(namespace).encode() + b"\0")
    digest.update(spec.fingerprint)
    digest.update(f"{spec.num_layers}/{spec.num_kv_heads}/{spec.head_dim}/{spec.dtype}\0"
                  .encode())
    digest.update(json.dumps(asdict(policy), sort_keys=True).encode())
    digest.update(json.dumps(asdict(document), sort_keys=True).encode())
    digest.update(array("I", doc_ids).tobytes())
    return f"{KEY_PREFIX}{digest.hexdigest()}"


def namespace_of(tenant: str, cache_salt: str) -> str:
    return json.dumps([tenant, cache_salt])


@dataclass(frozen=True)
class PrefixStoreConfig:
    ttl_s: float = 3600.0
    max_bytes: int = 1 << 30  # of every tenant's documents in the store
    tenant_max_bytes: int | None = None  # of one tenant's; None: max_bytes
    document: DocumentCacheConfig = DEFAULT_DOCUMENT_CACHE  # how documents are compressed

    def __post_init__(self) -> None:
        if not self.ttl_s > 0:
            raise ValueError(f"--prefix-cache-ttl-s must be > 0, got {self.ttl_s}")
        if self.max_bytes < 0:
            raise ValueError(f"--prefix-cache-max-bytes must be >= 0, got {self.max_bytes}")
        if self.tenant_max_bytes is not None and self.tenant_max_bytes < 0:
            raise ValueError(f"--prefix-cache-tenant-max-bytes must be >= 0, "
                             f"got {self.tenant_max_bytes}")

    @property
    def limits(self) -> LedgerLimits:
        tenant = self.max_bytes if self.tenant_max_bytes is None else self.tenant_max_bytes
        return LedgerLimits(self.max_bytes, min(tenant, self.max_bytes))


@dataclass(frozen=True)
class Document:
    """One request's reusable document: its store key and whose it is, and its token ids
    (what a stored cache must have been made from)."""

    key: str
    tenant: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class PrefixOutcome:
    state: str  # STORED, HIT or BYPASS
    reason: str = ""  # with BYPASS: OVER_CAP, STORE_FULL or STORE_UNAVAILABLE


Compress = Callable[[], Awaitable[SequenceCache]]
# what is wrong with a stored cache for this request (None: nothing), beyond the codec's checks
Check = Callable[[SequenceCache], str | None]
Shared = tuple[SequenceCache, PrefixOutcome] | None  # a compression's result, for its waiters


class PrefixStore:
    def __init__(self, store: BlobStore, spec: BlobSpec, secret: ClusterSecret,
                 config: PrefixStoreConfig) -> None:
        self.store, self.spec, self.secret, self.config = store, spec, secret, config
        self.ledger = Ledger(store, config.limits)
        self.in_flight: dict[str, asyncio.Future[Shared]] = {}
        self.seconds_per_token = 0.0  # of the last compression, to estimate the time saved
        self.published: set[str] = set()  # tenants whose bytes the gauge shows

    async def get_or_compress(self, doc: Document, compress: Compress, check: Check
                              ) -> tuple[SequenceCache, PrefixOutcome]:
        """The document's cache and how it was had: ``hit`` (from the store, or from a
        concurrent request's compression that was stored), ``stored`` or ``bypass``."""
        while True:
            pending = self.in_flight.get(doc.key)
            if pending is not None:
                shared = await asyncio.shield(pending)
                if shared is None:
                    continue  # that compression failed: look again
                cache, outcome = shared
                return cache, self._count(doc, PrefixOutcome(HIT) if outcome.state == STORED
                                          else outcome)
            cached = await self._lookup(doc, check)
            if cached is not None:
                return cached, self._count(doc, PrefixOutcome(HIT))
            if doc.key not in self.in_flight:  # nobody claimed it during the lookup: claim it
                break
        done: asyncio.Future[Shared] = asyncio.get_running_loop().create_future()
        self.in_flight[doc.key] = done
        shared = None
        try:
            start = time.perf_counter()
            cache = await compress()
            self.seconds_per_token = (time.perf_counter() - start) / len(doc.token_ids)
            blob = await asyncio.to_thread(encode_blob, cache, self.spec, self._seal(doc))
            shared = cache, await self._store(doc, blob)
        finally:
            del self.in_flight[doc.key]
            done.set_result(shared)
        return cache, self._count(doc, shared[1])

    def _seal(self, doc: Document) -> Seal:
        return Seal(self.secret, doc.key, tokens_digest(doc.token_ids))

    def _count(self, doc: Document, outcome: PrefixOutcome) -> PrefixOutcome:
        metrics.PREFIX_CACHE.labels(outcome.state, doc.tenant).inc()
        if outcome.state == HIT:
            metrics.PREFIX_CACHE_SAVED.inc(self.seconds_per_token * len(doc.token_ids))
        return outcome

    async def _lookup(self, doc: Document, check: Check) -> SequenceCache | None:
        try:
            data = await self.store.get(doc.key)
            cache = await asyncio.to_thread(decode_blob, data, self.spec, self._seal(doc))
            problem = check(cache) if cache.prompt_len == len(doc.token_ids) else (
                f"it holds {cache.prompt_len} tokens, the document {len(doc.token_ids)}")
        except BlobNotFound:
            return None
        except (BlobError, StoreCorrupted) as exc:
            problem = str(exc)
        if problem is not None:
            log.warning("dropping the cached document %s: %s", doc.key, problem)
            metrics.PREFIX_CACHE.labels("dropped", doc.tenant).inc()
            await self._delete(doc.key)
            return None
        await self._keep(doc, data)
        return cache

    async def _keep(self, doc: Document, data: bytearray) -> None:
        """A hit: its ledger entry marked used, and its blob put again once less than half its
        TTL is left (or once the ledger lost it: entered again). Failures are logged: the
        cache was read and serves this request."""
        ttl_s = self.config.ttl_s
        try:
            entry = await self.ledger.touch(doc.key)
            if entry is None:
                reservation = await self.ledger.reserve(doc.key, doc.tenant, len(data), ttl_s)
                await self._delete_each(reservation.evicted)
                if not reservation.fits:
                    await self.store.delete(doc.key)
                    return
            elif entry.expires_at - time.time() >= ttl_s / 2:
                return
            await self.store.put(doc.key, data, ttl_s=ttl_s)  # its TTL starts again
            await self.ledger.touch(doc.key, ttl_s)
        except StoreError as exc:
            log.warning("could not refresh the cached document %s: %s", doc.key, exc)
        finally:
            self._publish_usage()

    async def _store(self, doc: Document, blob: bytearray) -> PrefixOutcome:
        try:
            reservation = await self.ledger.reserve(doc.key, doc.tenant, len(blob),
                                                    self.config.ttl_s)
            if not reservation.fits:
                return PrefixOutcome(BYPASS, OVER_CAP)
            await self._delete_each(reservation.evicted)
            await self.store.put(doc.key, blob, ttl_s=self.config.ttl_s)
        except StoreError as exc:
            log.warning("document cache not stored (%s): serving without it", exc)
            await self._delete(doc.key)
            return PrefixOutcome(BYPASS, STORE_FULL if isinstance(exc, StoreFull)
                                 else STORE_UNAVAILABLE)
        finally:
            self._publish_usage()
        return PrefixOutcome(STORED)

    async def _delete(self, key: str) -> None:
        """The blob and its ledger entry (the blob's TTL removes what a failure leaves)."""
        try:
            await self.ledger.remove(key)
            await self.store.delete(key)
        except StoreError as exc:
            log.warning("could not delete the cached document %s: %s", key, exc)

    async def _delete_each(self, keys: Sequence[str]) -> None:
        for key in keys:
            await self.store.delete(key)

    def _publish_usage(self) -> None:
        usage = self.ledger.usage
        for tenant in self.published | set(usage):
            metrics.PREFIX_CACHE_BYTES.labels(tenant).set(usage[tenant])
        self.published |= set(usage)
