"""NATS JetStream back end (``nats://host:4222``): one stream holds every blob.

Layout in stream ``stream`` (default ``SNAPSTREAM_BLOBS``), subjects under ``subject_prefix``
(default ``snapstream.blob``), one message kept per subject::

    <subject_prefix>.m.<key>                  manifest (JSON), published last
    <subject_prefix>.c.<key>.<put_id>.<i>     chunk i, at most the server's max_payload
    <subject_prefix>.r.<name>                 a record; its version is its message's sequence

Chunks are published and read over the store's own connections (kvstore.stores.nats_direct),
which send each payload from where it lies and receive it straight into place; manifests,
purges and stream management go through nats-py.

Room: with ``max_bytes`` (a URL may carry it, ``?max_bytes=N``, as ``max_ttl_s``), the stream
holds at most that many bytes and refuses a publish past them (discard new: nothing stored is
dropped to make room), which the store raises as ``StoreFull``. Every process must open the
stream with the same ``max_bytes`` and ``max_ttl_s``.

TTL: JetStream before 2.11 has no per-message TTL, so the stream's ``max_age`` (``max_ttl_s``)
bounds every blob's life and removes its messages; a blob's own ``ttl_s`` (at most
``max_ttl_s``) is enforced on read against the manifest's ``expires_at`` (the writer's clock),
and the reader that finds a blob expired purges it. Reads are JetStream direct gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import urlsplit

import nats
import nats.errors
import nats.js.errors
from nats.js import api

from kvstore.stores.base import (
    BlobNotFound,
    BlobStore,
    Manifest,
    StoredRecord,
    StoreLimits,
    StoreUnavailable,
    redact_url,
    register_store,
)
from kvstore.stores.nats_direct import JetStreamConnection, NatsAddress, NatsError
from kvstore.stores.sockets import ConnectionPool, client_tls

log = logging.getLogger(__name__)

CHUNKS_PER_ROUND_TRIP = 8  # pipelined publishes / direct gets
ROUND_TRIPS_IN_FLIGHT = 2  # of a put or get, on two connections
IDLE_DIRECT_CONNECTIONS = 4  # kept open between calls, for puts and gets side by side
STREAM_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
SUBJECT_PATTERN = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
STREAM_NAME_IN_USE = 10058  # JetStream API error code
WRONG_LAST_SEQUENCE = 10071  # a publish's expected last subject sequence did not hold
# JetStream's refusals of a publish for want of room: the server's or account's storage limit
FULL_DESCRIPTIONS = ("insufficient resources", "maximum bytes exceeded",
                     "resource limits exceeded")


@dataclass(frozen=True)
class NatsStoreConfig:
    url: str
    chunk_size: int | None = None  # None: the server's max_payload (1 MiB by default)
    stream: str = "SNAPSTREAM_BLOBS"
    subject_prefix: str = "snapstream.blob"
    max_ttl_s: float = 3600.0
    max_bytes: int | None = None  # of the whole stream; None: no limit
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 5.0  # per JetStream request (one chunk, one manifest)
    tls_ca_file: str | None = None  # tls://: the CA of the server's certificate

    @property
    def tls(self) -> ssl.SSLContext | None:
        return client_tls(self.tls_ca_file) if urlsplit(self.url).scheme == "tls" else None

    def __post_init__(self) -> None:
        for name, kind in (("max_ttl_s", float), ("max_bytes", int)):  # as a URL gives them
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, kind(getattr(self, name)))
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {self.max_bytes}")
        if self.chunk_size is not None and self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be > 0, got {self.chunk_size}")
        if not STREAM_PATTERN.fullmatch(self.stream):
            raise ValueError(f"stream must match {STREAM_PATTERN.pattern}, got {self.stream!r}")
        if not SUBJECT_PATTERN.fullmatch(self.subject_prefix):
            raise ValueError(f"subject_prefix must be dot-separated tokens of "
                             f"A-Z a-z 0-9 _ -, got {self.subject_prefix!r}")
        for name in ("max_ttl_s", "connect_timeout_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


async def _log_error(exc: Exception) -> None:
    log.warning("nats: %s: %s", type(exc).__name__, exc)


@register_store
class NatsBlobStore(BlobStore):
    schemes = ("nats", "tls")
    chunks_per_round_trip = CHUNKS_PER_ROUND_TRIP
    round_trips_in_flight = ROUND_TRIPS_IN_FLIGHT
    url_options = ("tls_ca_file", "max_bytes", "max_ttl_s")
    unavailable_errors = (
        nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError,
        nats.errors.ConnectionReconnectingError, nats.errors.NoRespondersError,
        nats.errors.NoServersError, nats.errors.OutboundBufferLimitError,
        nats.errors.StaleConnectionError, nats.errors.TimeoutError,
        nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError, OSError,
        NatsError,
    )

    def __init__(self, config: NatsStoreConfig, client: nats.NATS, chunk_size: int) -> None:
        super().__init__(config.url, chunk_size)
        self._config = config
        self._client = client
        self._js = client.jetstream(timeout=config.request_timeout_s)
        self._direct = ConnectionPool(self._open_direct, max_idle=IDLE_DIRECT_CONNECTIONS)
        self._tls = config.tls

    @classmethod
    async def open(cls, url: str, **options: Any) -> Self:
        config = NatsStoreConfig(url=url, **options)
        client = await _connect(config)
        chunk_size = config.chunk_size or client.max_payload
        if chunk_size > client.max_payload:
            await client.close()
            raise ValueError(f"chunk_size {chunk_size} exceeds the max_payload "
                             f"{client.max_payload} of the NATS server at {redact_url(url)}")
        store = cls(config, client, chunk_size)
        try:
            with store._translate_errors():
                await store._ensure_stream()
        except BaseException:
            await store.close()
            raise
        return store

    async def put(self, key: str, data: bytes | bytearray | memoryview, ttl_s: float) -> None:
        if ttl_s > self._config.max_ttl_s:
            raise ValueError(f"ttl_s {ttl_s} exceeds max_ttl_s {self._config.max_ttl_s} "
                             f"of NATS stream {self._config.stream}")
        await super().put(key, data, ttl_s)

    async def close(self) -> None:
        await self.janitor.close()
        self._direct.close()
        with contextlib.suppress(*self.unavailable_errors):  # the server may be gone
            await self._client.close()

    async def _ensure_stream(self) -> None:
        config = api.StreamConfig(
            name=self._config.stream, subjects=[f"{self._config.subject_prefix}.>"],
            max_age=self._config.max_ttl_s, max_msgs_per_subject=1, allow_direct=True,
            max_bytes=self._config.max_bytes or -1, storage=api.StorageType.FILE,
            discard=api.DiscardPolicy.NEW)
        try:
            await self._js.add_stream(config)
        except nats.js.errors.ServiceUnavailableError as exc:
            raise StoreUnavailable(f"KV store {self.url}: JetStream does not answer "
                                   f"(is the server running with -js?)") from exc
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != STREAM_NAME_IN_USE:
                raise
            raise ValueError(f"NATS stream {self._config.stream!r} at {self.url} exists with "
                             f"another configuration; give every process the same "
                             f"subject_prefix, max_ttl_s and max_bytes, or delete the "
                             f"stream") from exc

    def _manifest_subject(self, key: str) -> str:
        return f"{self._config.subject_prefix}.m.{key}"

    def _chunk_subject(self, key: str, put_id: str, index: int | str) -> str:
        return f"{self._config.subject_prefix}.c.{key}.{put_id}.{index}"

    async def _write_chunks(self, key: str, manifest: Manifest, indices: range,
                            chunks: Sequence[memoryview]) -> None:
        items = [(self._chunk_subject(key, manifest.put_id, index), chunk)
                 for index, chunk in zip(indices, chunks, strict=True)]
        await self._direct.run(lambda conn: conn.publish_many(items))

    async def _write_manifest(self, key: str, manifest: Manifest) -> None:
        await self._js.publish(self._manifest_subject(key), manifest.to_bytes())

    async def _read_manifest(self, key: str) -> Manifest:
        message = await self._direct_get(key, self._manifest_subject(key))
        manifest = Manifest.from_bytes(key, message.data or b"")
        if manifest.expires_at <= time.time():
            await self._purge(self._manifest_subject(key), up_to_seq=message.seq)
            await self._purge(self._chunk_subject(key, manifest.put_id, ">"))
            raise BlobNotFound(key, "expired")
        return manifest

    async def _read_chunks_into(self, key: str, manifest: Manifest, indices: range,
                                views: Sequence[memoryview]) -> list[int]:
        subjects = [self._chunk_subject(key, manifest.put_id, index) for index in indices]
        return await self._direct.run(lambda conn: conn.get_into(subjects, views))

    async def _open_direct(self) -> JetStreamConnection:
        """A connection to the server nats-py is connected to, with the URL's credentials."""
        url = self._client.connected_url
        if url is None:
            raise ConnectionRefusedError("nats-py is not connected (reconnecting)")
        address = NatsAddress(host=url.hostname or "localhost", port=url.port or 4222,
                              user=url.username, password=url.password, tls=self._tls)
        return await JetStreamConnection.open(address, self._config.stream,
                                              self._config.connect_timeout_s,
                                              self._config.request_timeout_s)

    async def _keys(self) -> list[str]:
        head = self._manifest_subject("")
        info = await self._js.stream_info(self._config.stream, subjects_filter=f"{head}*")
        return [subject.removeprefix(head) for subject in info.state.subjects or {}]

    def _record_subject(self, name: str) -> str:
        return f"{self._config.subject_prefix}.r.{name}"

    async def _read_record(self, name: str) -> StoredRecord:
        try:
            message = await self._js.get_msg(self._config.stream,
                                             subject=self._record_subject(name), direct=True)
        except nats.js.errors.NotFoundError:
            return StoredRecord(None, 0)
        return StoredRecord(message.data or b"", message.seq)

    async def _write_record(self, name: str, value: bytes, version: int) -> bool:
        try:
            await self._js.publish(self._record_subject(name), value, headers={
                "Nats-Expected-Last-Subject-Sequence": str(version)})
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                return False
            raise
        return True

    async def _limits(self) -> StoreLimits:
        return StoreLimits(max_bytes=self._config.max_bytes, max_ttl_s=self._config.max_ttl_s)

    def _is_full(self, exc: Exception) -> bool:
        return isinstance(exc, nats.js.errors.APIError | NatsError) and any(
            text in str(exc) for text in FULL_DESCRIPTIONS)

    async def _delete(self, key: str) -> None:
        await self._purge(self._manifest_subject(key))
        await self._purge(f"{self._config.subject_prefix}.c.{key}.>")

    async def _discard(self, key: str, manifest: Manifest) -> None:
        await self._purge(self._chunk_subject(key, manifest.put_id, ">"))
        try:
            message = await self._js.get_msg(self._config.stream,
                                             subject=self._manifest_subject(key), direct=True)
        except nats.js.errors.NotFoundError:
            return
        if Manifest.put_id_of(message.data or b"") == manifest.put_id:
            await self._purge(self._manifest_subject(key), up_to_seq=message.seq)

    async def _direct_get(self, key: str, subject: str) -> api.RawStreamMsg:
        try:
            return await self._js.get_msg(self._config.stream, subject=subject, direct=True)
        except nats.js.errors.NotFoundError:
            raise BlobNotFound(key) from None

    async def _purge(self, subject: str, up_to_seq: int | None = None) -> None:
        """Purge the messages on subject (a wildcard is fine), all or those up to up_to_seq."""
        before_seq = None if up_to_seq is None else up_to_seq + 1
        await self._js.purge_stream(self._config.stream, seq=before_seq, subject=subject)


async def _connect(config: NatsStoreConfig) -> nats.NATS:
    """Connect within connect_timeout_s, then reconnect forever after a loss (nats-py's default
    gives up after two minutes and leaves the client closed for good). A server that refuses
    the credentials fails it at once; a failure names the server's last complaint."""
    errors: list[Exception] = []
    refused = asyncio.Event()

    async def record(exc: Exception) -> None:
        errors.append(exc)
        await _log_error(exc)
        if AUTH_VIOLATION in str(exc).lower():
            refused.set()

    connect = asyncio.ensure_future(nats.connect(
        config.url, connect_timeout=config.connect_timeout_s, max_reconnect_attempts=-1,
        error_cb=record, **({"tls": config.tls} if config.tls is not None else {})))
    watch = asyncio.ensure_future(refused.wait())
    done, _ = await asyncio.wait({connect, watch}, timeout=config.connect_timeout_s,
                                 return_when=asyncio.FIRST_COMPLETED)
    watch.cancel()
    try:
        if connect not in done:
            connect.cancel()
        return await connect
    except (asyncio.CancelledError, nats.errors.Error, *NatsBlobStore.unavailable_errors) as exc:
        refusals = [e for e in errors if AUTH_VIOLATION in str(e).lower()]
        telling = refusals or errors  # a refusal says more than the resets that follow it
        last = f" (last error: {_describe(telling[-1])})" if telling else ""
        raise StoreUnavailable(f"KV store {redact_url(config.url)} unavailable: no connection "
                               f"within {config.connect_timeout_s} s{last}") from exc


AUTH_VIOLATION = "authorization violation"


def _describe(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    if AUTH_VIOLATION in text.lower():
        return f"{text}: check the user and password (or token) in the URL"
    return text
