"""A prefill worker's document caches in the KV store (compress once, ask many).

A document's cache (``snapstream.prefix_cache``) is stored as a KV blob (the codec's header,
checksums and model fingerprint included) under a key derived from everything that shapes it:
:func:`prefix_key`. Lookups and stores go through :class:`PrefixStore`:

- **single flight**: concurrent requests for one document on this worker compress it once; the
  others wait for that cache (across workers each compresses it once, the last put wins);
- **TTL refreshed on hit**: a hit re-puts the blob when this worker has not written it for half
  the TTL, so a document in use stays while one unused expires;
- **size cap**: the blobs this worker stored are held to ``max_bytes``, the least recently used
  deleted first; a document larger than the cap, or one the store refuses (out of memory,
  unavailable), is served without caching: ``bypass``;
- **never served corrupt**: a blob that fails the codec's checks (truncated, corrupted, of
  another version, model or layout) is deleted and the document compressed again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from array import array
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass

from kvstore import BlobStore
from kvstore.blob_errors import BlobError
from kvstore.codec import BlobSpec, decode_blob, encode_blob
from kvstore.stores.errors import BlobNotFound, StoreCorrupted, StoreError
from serving import metrics
from snapstream.kvcache import SequenceCache
from snapstream.policy import CachePolicy
from snapstream.prefix_config import DEFAULT_DOCUMENT_CACHE, DocumentCacheConfig

log = logging.getLogger(__name__)

PREFIX_FORMAT = 5  # the stored cache's meaning: a change makes new keys (2: DocumentCacheConfig;
# 3: whole documents, the superset's picks first; 4: whole documents in position order; 5: fp8
# rows hold each row's Hadamard transform)
STORED, HIT, BYPASS = "stored", "hit", "bypass"


def prefix_key(spec: BlobSpec, policy: CachePolicy, doc_ids: Sequence[int],
               document: DocumentCacheConfig = DEFAULT_DOCUMENT_CACHE) -> str:
    """The store key of a document's cache: a SHA-256 of the prefix format, the model
    (fingerprint, shapes, KV dtype), every field of the policy and of the worker's document
    cache config (scorer, superset) and the document's token ids."""
    digest = hashlib.sha256(f"snapstream-prefix/{PREFIX_FORMAT}\0".encode())
    digest.update(spec.fingerprint)
    digest.update(f"{spec.num_layers}/{spec.num_kv_heads}/{spec.head_dim}/{spec.dtype}\0"
                  .encode())
    digest.update(json.dumps(asdict(policy), sort_keys=True).encode())
    digest.update(json.dumps(asdict(document), sort_keys=True).encode())
    digest.update(array("I", doc_ids).tobytes())
    return f"prefix-{digest.hexdigest()}"


@dataclass(frozen=True)
class PrefixStoreConfig:
    ttl_s: float = 3600.0
    max_bytes: int = 1 << 30  # of blobs this worker stored and still holds
    document: DocumentCacheConfig = DEFAULT_DOCUMENT_CACHE  # how documents are compressed

    def __post_init__(self) -> None:
        if not self.ttl_s > 0:
            raise ValueError(f"--prefix-cache-ttl-s must be > 0, got {self.ttl_s}")
        if self.max_bytes < 0:
            raise ValueError(f"--prefix-cache-max-bytes must be >= 0, got {self.max_bytes}")


Compress = Callable[[], Awaitable[SequenceCache]]


class PrefixStore:
    def __init__(self, store: BlobStore, spec: BlobSpec, config: PrefixStoreConfig) -> None:
        self.store, self.spec, self.config = store, spec, config
        self.held: OrderedDict[str, int] = OrderedDict()  # key -> bytes, least recent first
        self.written_at: dict[str, float] = {}  # key -> monotonic time of this worker's put
        self.in_flight: dict[str, asyncio.Future[str]] = {}
        self.seconds_per_token = 0.0  # of the last compression, to estimate the time saved

    async def get_or_compress(self, key: str, num_tokens: int, compress: Compress
                              ) -> tuple[SequenceCache, str]:
        """The document's cache and how it was had: ``hit`` (from the store, or from a
        concurrent request's compression), ``stored`` or ``bypass`` (compressed here)."""
        while True:
            while key in self.in_flight:
                await asyncio.shield(self.in_flight[key])
            cached = await self._lookup(key)
            if cached is not None:
                metrics.PREFIX_CACHE.labels(HIT).inc()
                metrics.PREFIX_CACHE_SAVED.inc(self.seconds_per_token * num_tokens)
                return cached, HIT
            if key not in self.in_flight:  # nobody claimed it during the lookup: claim it
                break
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.in_flight[key] = done
        try:
            start = time.perf_counter()
            cache = await compress()
            self.seconds_per_token = (time.perf_counter() - start) / num_tokens
            outcome = await self._store(key, encode_blob(cache, self.spec))
        finally:
            del self.in_flight[key]
            done.set_result("")
        metrics.PREFIX_CACHE.labels(outcome).inc()
        return cache, outcome

    async def _lookup(self, key: str) -> SequenceCache | None:
        try:
            data = await self.store.get(key)
            cache = decode_blob(data, self.spec)
        except BlobNotFound:
            self._forget(key)
            return None
        except (BlobError, StoreCorrupted) as exc:
            log.warning("dropping the cached document %s: %s", key, exc)
            metrics.PREFIX_CACHE.labels("dropped").inc()
            self._forget(key)
            await self.store.delete(key)
            return None
        if key in self.held:
            self.held.move_to_end(key)
        age = time.monotonic() - self.written_at.get(key, -self.config.ttl_s)
        if age >= self.config.ttl_s / 2 and len(data) <= self.config.max_bytes:
            try:
                await self._put(key, data)  # its TTL starts again
            except StoreError as exc:
                log.warning("could not refresh the cached document %s: %s", key, exc)
        return cache

    async def _store(self, key: str, blob: bytearray) -> str:
        if len(blob) > self.config.max_bytes:
            return BYPASS
        try:
            await self._put(key, blob)
        except StoreError as exc:
            log.warning("document cache not stored (%s): serving without it", exc)
            return BYPASS
        return STORED

    async def _put(self, key: str, blob: bytes | bytearray) -> None:
        """Writes ``blob`` with the TTL, after deleting the least recently used of this
        worker's blobs that the size cap needs gone."""
        self._forget(key)
        while self.held and sum(self.held.values()) + len(blob) > self.config.max_bytes:
            evicted = next(iter(self.held))
            self._forget(evicted)
            await self.store.delete(evicted)
        await self.store.put(key, blob, ttl_s=self.config.ttl_s)
        self.held[key] = len(blob)
        self.held.move_to_end(key)
        self.written_at[key] = time.monotonic()
        metrics.PREFIX_CACHE_BYTES.set(sum(self.held.values()))

    def _forget(self, key: str) -> None:
        self.held.pop(key, None)
        self.written_at.pop(key, None)
        metrics.PREFIX_CACHE_BYTES.set(sum(self.held.values()))
