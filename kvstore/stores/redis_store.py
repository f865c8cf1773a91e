"""Redis back end (``redis://host:6379/0``): chunks as string keys with a TTL, the manifest last.

Chunks travel over the store's own RESP connections (kvstore.stores.resp), straight between
the caller's buffers and the socket; manifests, deletes and scans go through redis-py.

Layout under ``prefix`` (default ``snapstream``)::

    <prefix>:blob:<key>                    manifest (JSON), expires with the blob
    <prefix>:chunk:<key>:<put_id>:<i>      chunk i
    <prefix>:record:<name>                 a record: hash of its version (v) and value (d)

Every key is written with what is left of the blob's TTL (PX), so chunks and manifest expire
together at put start + ttl_s; Redis expires them on its own clock.
"""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import urlsplit

import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from kvstore.stores.base import (
    BlobNotFound,
    BlobStore,
    Manifest,
    StoreCorrupted,
    StoredRecord,
    StoreLimits,
    StoreUnavailable,
    register_store,
)
from kvstore.stores.resp import RespAddress, RespConnection, RespError
from kvstore.stores.sockets import ConnectionPool, client_tls

DEFAULT_CHUNK_SIZE = 8 << 20
MAX_CHUNK_SIZE = 512 << 20  # Redis bulk strings stop at 512 MiB
RECONNECT_RETRIES = 2
CHUNKS_PER_ROUND_TRIP = 4  # pipelined SETs/GETs per round trip
# a put or get keeps two round trips (two connections) in flight, so the server is never idle
# waiting for the client's next round
ROUND_TRIPS_IN_FLIGHT = 2
IDLE_BULK_CONNECTIONS = 4  # kept open between calls, for puts and gets running side by side
PREFIX_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")
# a record's compare and set, atomic on the server: KEYS[1] the record, ARGV the version the
# writer read and the new value -> 1 written, 0 another writer came first
WRITE_RECORD = """
local version = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if version ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'v', version + 1, 'd', ARGV[2])
return 1
"""


@dataclass(frozen=True)
class RedisStoreConfig:
    url: str
    chunk_size: int = DEFAULT_CHUNK_SIZE
    prefix: str = "snapstream"
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 5.0  # per socket read or write
    tls_ca_file: str | None = None  # rediss://: the CA of the server's certificate

    @property
    def tls(self) -> ssl.SSLContext | None:
        return client_tls(self.tls_ca_file) if urlsplit(self.url).scheme == "rediss" else None

    def __post_init__(self) -> None:
        if not 0 < self.chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError(f"chunk_size must be in (0, {MAX_CHUNK_SIZE}], got {self.chunk_size}")
        if not PREFIX_PATTERN.fullmatch(self.prefix):
            raise ValueError(f"prefix must match {PREFIX_PATTERN.pattern}, got {self.prefix!r}")
        for name in ("connect_timeout_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def _milliseconds_left(manifest: Manifest) -> int:
    """Time to live of the blob's keys; 1 ms when a put was slower than its TTL."""
    return max(1, int((manifest.expires_at - time.time()) * 1000))


@register_store
class RedisBlobStore(BlobStore):
    schemes = ("redis", "rediss")
    chunks_per_round_trip = CHUNKS_PER_ROUND_TRIP
    round_trips_in_flight = ROUND_TRIPS_IN_FLIGHT
    unavailable_errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                          OSError, RespError)

    def __init__(self, config: RedisStoreConfig, client: redis.asyncio.Redis) -> None:
        super().__init__(config.url, config.chunk_size)
        self._prefix = config.prefix
        self._client = client
        options = client.connection_pool.connection_kwargs
        address = RespAddress(host=options.get("host", "localhost"),
                              port=int(options.get("port", 6379)), db=int(options.get("db", 0)),
                              username=options.get("username"), password=options.get("password"),
                              tls=config.tls)
        self._write_record_script = client.register_script(WRITE_RECORD)
        self._bulk = ConnectionPool(
            lambda: RespConnection.open(address, config.connect_timeout_s,
                                        config.request_timeout_s),
            max_idle=IDLE_BULK_CONNECTIONS)

    @classmethod
    async def open(cls, url: str, **options: Any) -> Self:
        config = RedisStoreConfig(url=url, **options)
        # a pooled connection dies with a server restart; every command here is idempotent, so
        # a command that finds its connection closed is sent again on a fresh one
        retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), RECONNECT_RETRIES)
        tls = {"ssl_ca_certs": config.tls_ca_file} if config.tls is not None else {}
        client = redis.asyncio.from_url(url, **tls, socket_connect_timeout=config.connect_timeout_s,
                                        socket_timeout=config.request_timeout_s, retry=retry,
                                        retry_on_error=[redis.exceptions.ConnectionError])
        store = cls(config, client)
        try:
            with store._translate_errors():
                await client.ping()
        except StoreUnavailable:
            await client.aclose()
            raise
        return store

    async def close(self) -> None:
        await self.janitor.close()
        self._bulk.close()
        await self._client.aclose()

    def _manifest_key(self, key: str) -> str:
        return f"{self._prefix}:blob:{key}"

    def _chunk_keys(self, key: str, manifest: Manifest, indices: range | None = None
                    ) -> list[str]:
        """Names of chunks ``indices`` (all when None)."""
        head = f"{self._prefix}:chunk:{key}:{manifest.put_id}"
        indices = range(manifest.num_chunks) if indices is None else indices
        return [f"{head}:{index}" for index in indices]

    async def _write_chunks(self, key: str, manifest: Manifest, indices: range,
                            chunks: Sequence[memoryview]) -> None:
        items = [(name.encode(), chunk)
                 for name, chunk in zip(self._chunk_keys(key, manifest, indices), chunks,
                                        strict=True)]
        ttl_ms = _milliseconds_left(manifest)
        await self._bulk.run(lambda conn: conn.set_many(items, ttl_ms))

    async def _write_manifest(self, key: str, manifest: Manifest) -> None:
        await self._client.set(self._manifest_key(key), manifest.to_bytes(),
                               px=_milliseconds_left(manifest))

    async def _read_manifest(self, key: str) -> Manifest:
        raw = await self._client.get(self._manifest_key(key))
        if raw is None:
            raise BlobNotFound(key)
        return Manifest.from_bytes(key, raw)

    async def _read_chunks_into(self, key: str, manifest: Manifest, indices: range,
                                views: Sequence[memoryview]) -> list[int]:
        wanted = [name.encode() for name in self._chunk_keys(key, manifest, indices)]
        return await self._bulk.run(lambda conn: conn.get_into(wanted, views))

    async def _keys(self) -> list[str]:
        head = self._manifest_key("")
        return [name.decode().removeprefix(head)
                async for name in self._client.scan_iter(match=f"{head}*", count=1000)]

    def _record_key(self, name: str) -> str:
        return f"{self._prefix}:record:{name}"

    async def _read_record(self, name: str) -> StoredRecord:
        version, value = await self._client.hmget(self._record_key(name), "v", "d")
        return StoredRecord(value, int(version or 0))

    async def _write_record(self, name: str, value: bytes, version: int) -> bool:
        return bool(await self._write_record_script(keys=[self._record_key(name)],
                                                    args=[version, value]))

    async def _limits(self) -> StoreLimits:
        try:
            config = await self._client.config_get("maxmemory")
        except redis.exceptions.ResponseError:  # a managed Redis may not allow CONFIG
            return StoreLimits()
        max_bytes = int(config.get("maxmemory", 0) or 0)
        return StoreLimits(max_bytes=max_bytes or None)

    def _is_full(self, exc: Exception) -> bool:
        # redis-py's reply error for OOM; the chunk connections' own
        return isinstance(exc, redis.exceptions.OutOfMemoryError) or (
            isinstance(exc, RespError) and str(exc).startswith("OOM"))

    async def _delete(self, key: str) -> None:
        raw = await self._client.getdel(self._manifest_key(key))
        if raw is None:
            return
        try:
            names = self._chunk_keys(key, Manifest.from_bytes(key, raw))
        except StoreCorrupted:
            return  # its chunks cannot be named; they expire with their TTL
        if names:
            await self._client.delete(*names)

    async def _discard(self, key: str, manifest: Manifest) -> None:
        await self._client.delete(*self._chunk_keys(key, manifest))
        raw = await self._client.get(self._manifest_key(key))
        if raw is not None and Manifest.put_id_of(raw) == manifest.put_id:
            await self._client.delete(self._manifest_key(key))

