"""The blob store interface: opaque bytes under a key, with a TTL, in chunks behind a manifest.

Every back end keeps these invariants:

- ``put`` writes the payload chunks first and the manifest last, so ``get`` returns the whole
  blob or raises ``BlobNotFound``, never part of one;
- a blob stops being readable once ``ttl_s`` has passed since its ``put`` began;
- ``get`` returns exactly the bytes that were put (sizes and the manifest's CRC-32 are checked),
  in a fresh ``bytearray`` the caller owns;
- ``get`` does not consume: the caller deletes a blob once done with it (decode keeps it until
  the sequence ends, so that a failover can read it again); ``delete`` is idempotent.

Back ends implement five primitives (write chunks, write manifest, read manifest, read chunks,
delete); the chunking, checksum and validation live here, once. Besides blobs, a store keeps
small **records** that a writer replaces only if nobody replaced them since it read them
(compare and set on a version): the document cache's ledger is one.

A write the server refuses for want of room raises ``StoreFull``; one it cannot make for a
lost connection, ``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Self
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from kvstore.stores.errors import BlobNotFound, StoreCorrupted, StoreFull, StoreUnavailable
from kvstore.stores.janitor import Janitor
from kvstore.stores.manifest import Manifest

log = logging.getLogger(__name__)

KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,200}")
FULL_CLEANUP_WAIT_S = 5.0  # a put refused for want of room waits this long for its clean-up


def new_blob_key() -> str:
    """An unguessable key (192 random bits, URL-safe)."""
    return secrets.token_urlsafe(24)


def check_key(key: str) -> str:
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise ValueError(f"blob key {key!r} must be 1-200 characters of A-Z a-z 0-9 _ -")
    return key


@dataclass(frozen=True)
class StoredRecord:
    """A record's value (None: absent) and its version, which a write must name."""

    value: bytes | None
    version: int


@dataclass(frozen=True)
class StoreLimits:
    """What the store server says it holds at most; None where it sets or tells no limit."""

    max_bytes: int | None = None  # of everything stored (Redis maxmemory)
    max_ttl_s: float | None = None  # of one blob (a NATS stream's max_age)


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class BlobStore(ABC):
    """Async blob store. Open one with ``kvstore.open_store(url)``; close it when done."""

    schemes: ClassVar[tuple[str, ...]]  # the plain one, then the TLS one
    chunks_per_round_trip: ClassVar[int]  # chunks written or read per round trip
    round_trips_in_flight: ClassVar[int]  # of one put or get, each on its own connection
    unavailable_errors: ClassVar[tuple[type[BaseException], ...]]
    url_options: ClassVar[tuple[str, ...]] = ("tls_ca_file",)  # options a URL may carry

    def __init__(self, url: str, chunk_size: int) -> None:
        self.url = redact_url(url)
        self.chunk_size = chunk_size
        self.janitor = Janitor()

    @classmethod
    @abstractmethod
    async def open(cls, url: str, **options: Any) -> Self:
        """Connect (raising StoreUnavailable) and return a ready store."""

    async def put(self, key: str, data: bytes | bytearray | memoryview, ttl_s: float) -> None:
        """Store data under key for ttl_s seconds, replacing any blob there.

        data is not copied before it is sent: do not modify it until put returns. Chunks go
        ``chunks_per_round_trip`` per round trip, ``round_trips_in_flight`` round trips at a
        time; the checksum is computed in a thread meanwhile (zlib releases the GIL).

        A put that fails or is cancelled (a deadline) leaves nothing behind: no new round trip
        starts, and once those in flight are answered, the janitor deletes this put's chunks
        and, if it was written, its manifest (retrying while the server is away).
        """
        check_key(key)
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 seconds, got {ttl_s}")
        view = memoryview(data).cast("B")
        manifest = Manifest(size=len(view), chunk_size=self.chunk_size, crc32=0,
                            put_id=secrets.token_hex(8), expires_at=time.time() + ttl_s)
        stop = asyncio.Event()
        writing = asyncio.ensure_future(self._write(key, view, manifest, stop))
        try:
            await asyncio.shield(writing)
        except BaseException as exc:
            stop.set()
            cleanup = self.janitor.soon(f"delete the failed put of blob {key!r}",
                                        lambda: self._discard_after(writing, key, manifest))
            if isinstance(exc, StoreFull):
                # the room the put took is given back before its caller hears of it, so that
                # the caller's next write (a request's blob after its document's) may fit
                await asyncio.wait([cleanup], timeout=FULL_CLEANUP_WAIT_S)
            raise

    async def _write(self, key: str, view: memoryview, manifest: Manifest,
                     stop: asyncio.Event) -> None:
        """Chunks, then the manifest; once ``stop`` is set, no new round trip starts."""
        checksum = asyncio.ensure_future(asyncio.to_thread(zlib.crc32, view))
        chunks = [view[start:start + self.chunk_size]
                  for start in range(0, len(view), self.chunk_size)]
        try:
            with self._translate_errors():
                await _in_groups(
                    len(chunks), self.chunks_per_round_trip, self.round_trips_in_flight, stop,
                    lambda group: self._write_chunks(key, manifest, group,
                                                     [chunks[i] for i in group]))
                crc32 = await checksum
                if not stop.is_set():
                    await self._write_manifest(key, replace(manifest, crc32=crc32))
        finally:
            await asyncio.wait([checksum])  # never leave the thread reading data after return

    async def _discard_after(self, writing: asyncio.Future, key: str, manifest: Manifest
                             ) -> None:
        await asyncio.wait([writing])  # the round trips in flight are answered (or failed)
        if not writing.cancelled():
            writing.exception()  # retrieved: the put already raised it to its caller
        with self._translate_errors():
            await self._discard(key, manifest)

    async def get(self, key: str) -> bytearray:
        """The blob under key, bit-exact; BlobNotFound if absent, expired or deleted.

        Chunks are read as a put writes them, into one buffer allocated up front; each group's
        checksum is carried on in a thread while later groups arrive.
        """
        check_key(key)
        with self._translate_errors():
            manifest = await self._read_manifest(key)
            return await self._assemble(key, manifest)

    async def _assemble(self, key: str, manifest: Manifest) -> bytearray:
        data = bytearray(manifest.size)
        view = memoryview(data)
        sizes = manifest.chunk_sizes()
        starts = [i * manifest.chunk_size for i in range(len(sizes))]
        groups = _groups(len(sizes), self.chunks_per_round_trip)
        in_flight = asyncio.Semaphore(self.round_trips_in_flight)

        async def fetch(group: range) -> list[int]:
            async with in_flight:
                return await self._read_chunks_into(
                    key, manifest, group, [view[starts[i]:starts[i] + sizes[i]] for i in group])

        fetches = [asyncio.ensure_future(fetch(group)) for group in groups]
        crc = 0
        try:
            for group, pending in zip(groups, fetches, strict=True):
                got = await pending
                if -1 in got:
                    raise BlobNotFound(key, f"chunk {group[got.index(-1)]} expired or deleted "
                                            f"while reading")
                if got != sizes[group.start:group.stop]:
                    raise StoreCorrupted(
                        f"blob {key!r}: chunks {group.start}..{group.stop - 1} have sizes {got}, "
                        f"its manifest says {manifest.size} bytes in chunks of "
                        f"{manifest.chunk_size}")
                end = starts[group[-1]] + sizes[group[-1]]
                crc = await asyncio.to_thread(zlib.crc32, view[starts[group.start]:end], crc)
        finally:  # a failure leaves later groups in flight: stop them
            await _stop_tasks(fetches)
        if crc != manifest.crc32:
            raise StoreCorrupted(f"blob {key!r}: payload checksum does not match its manifest")
        return data

    async def delete(self, key: str) -> None:
        """Remove the blob (manifest first, so readers stop at once); no-op when absent."""
        check_key(key)
        with self._translate_errors():
            await self._delete(key)

    def delete_soon(self, key: str) -> None:
        """Deletes the blob in a task of its own (:class:`~kvstore.stores.janitor.Janitor`),
        which cancelling the caller does not stop and which retries while the server is away."""
        check_key(key)
        self.janitor.soon(f"delete blob {key!r}", lambda: self.delete(key))

    async def read_record(self, name: str) -> StoredRecord:
        """The record ``name`` (a key's characters) as stored now."""
        check_key(name)
        with self._translate_errors():
            return await self._read_record(name)

    async def write_record(self, name: str, value: bytes, version: int) -> bool:
        """Replaces the record ``name`` with ``value`` if it is still at ``version`` (0: absent);
        False, writing nothing, when another writer came first."""
        check_key(name)
        with self._translate_errors():
            return await self._write_record(name, value, version)

    async def limits(self) -> StoreLimits:
        """The server's limits, as far as it tells them."""
        with self._translate_errors():
            return await self._limits()

    async def exists(self, key: str) -> bool:
        check_key(key)
        try:
            with self._translate_errors():
                await self._read_manifest(key)
        except BlobNotFound:
            return False
        return True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def keys(self) -> list[str]:
        """Keys of the blobs whose manifest is stored (for tests and operators)."""
        with self._translate_errors():
            return sorted(await self._keys())

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def _write_chunks(self, key: str, manifest: Manifest, indices: range,
                            chunks: Sequence[memoryview]) -> None:
        """Store ``chunks[i]`` as chunk ``indices[i]``, in one round trip where the back end
        can, so that they expire at manifest.expires_at (or later)."""

    @abstractmethod
    async def _write_manifest(self, key: str, manifest: Manifest) -> None:
        """Store the manifest, making the blob readable until manifest.expires_at."""

    @abstractmethod
    async def _read_manifest(self, key: str) -> Manifest:
        """The manifest of a readable blob, else BlobNotFound."""

    @abstractmethod
    async def _read_chunks_into(self, key: str, manifest: Manifest, indices: range,
                                views: Sequence[memoryview]) -> list[int]:
        """Chunk ``indices[i]`` into ``views[i]``, in one round trip where the back end can.
        -> each chunk's stored size (a longer chunk fills its view; the caller compares
        sizes), -1 for a chunk that is gone (expired or deleted meanwhile)."""

    @abstractmethod
    async def _delete(self, key: str) -> None: ...

    @abstractmethod
    async def _discard(self, key: str, manifest: Manifest) -> None:
        """Delete the chunks of the put ``manifest`` describes, and the manifest under key if
        it is that put's (a later put's blob stays)."""

    @abstractmethod
    async def _keys(self) -> list[str]: ...

    @abstractmethod
    async def _read_record(self, name: str) -> StoredRecord: ...

    @abstractmethod
    async def _write_record(self, name: str, value: bytes, version: int) -> bool: ...

    @abstractmethod
    async def _limits(self) -> StoreLimits: ...

    @abstractmethod
    def _is_full(self, exc: Exception) -> bool:
        """Whether ``exc`` is the server refusing a write for want of room."""

    @contextlib.contextmanager
    def _translate_errors(self) -> Iterator[None]:
        """Turns the back end's refusals for want of room into StoreFull and its connection
        errors into StoreUnavailable, naming the URL."""
        try:
            yield
        except Exception as exc:
            if self._is_full(exc):
                raise StoreFull(f"KV store {self.url} is full: {exc}; retry later") from exc
            if isinstance(exc, self.unavailable_errors):
                raise StoreUnavailable(f"KV store {self.url} unavailable: "
                                       f"{type(exc).__name__}: {exc}") from exc
            raise


async def _stop_tasks(tasks: Sequence[asyncio.Future]) -> None:
    """Cancel the tasks still running and wait until all are done. Their errors count as
    retrieved: the caller is raising another failure, or none."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()


def _groups(count: int, group_size: int) -> list[range]:
    return [range(first, min(first + group_size, count)) for first in range(0, count, group_size)]


async def _in_groups(count: int, group_size: int, in_flight: int, stop: asyncio.Event,
                     operation: Callable[[range], Awaitable[None]]) -> None:
    """``operation(group)`` over ``range(count)`` cut into groups of ``group_size``, at most
    ``in_flight`` groups at once, none started once ``stop`` is set; the first failure stops
    the others and is raised as it is."""
    gate = asyncio.Semaphore(in_flight)

    async def run(group: range) -> None:
        async with gate:
            if not stop.is_set():
                await operation(group)

    tasks = [asyncio.ensure_future(run(group)) for group in _groups(count, group_size)]
    try:
        await asyncio.gather(*tasks)
    finally:
        await _stop_tasks(tasks)


STORES: dict[str, type[BlobStore]] = {}


def register_store(cls: type[BlobStore]) -> type[BlobStore]:
    """Class decorator: make cls the back end of URLs with the schemes ``cls.schemes``."""
    for scheme in cls.schemes:
        if scheme in STORES:
            raise ValueError(f"KV store scheme {scheme!r} is already registered "
                             f"to {STORES[scheme].__name__}")
        STORES[scheme] = cls
    return cls


async def open_store(url: str, **options: Any) -> BlobStore:
    """Open the store a URL names (``redis://host:6379/0``, ``nats://host:4222``; over TLS
    ``rediss://`` and ``tls://``, with ``?tls_ca_file=/path/ca.pem`` to trust a private CA;
    a back end's other ``url_options`` may ride in the query too)."""
    parts = urlsplit(url)
    if parts.scheme not in STORES:
        known = ", ".join(f"{name}://" for name in sorted(STORES))
        raise ValueError(f"unknown KV store URL scheme {parts.scheme!r} in {redact_url(url)!r}; "
                         f"expected one of {known}")
    store_cls = STORES[parts.scheme]
    query = parse_qsl(parts.query)
    options = {**{k: v for k, v in query if k in store_cls.url_options}, **options}
    url = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query
                                                     if k not in store_cls.url_options])))
    return await store_cls.open(url, **options)
