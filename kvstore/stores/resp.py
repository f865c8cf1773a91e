"""The Redis store's bulk path: chunk SETs sent from the caller's buffer and GET replies received
into the destination buffer, over plain sockets speaking RESP2.

redis-py (with hiredis) reads a bulk reply through the asyncio stream buffer, the parser's buffer
and a new ``bytes`` before the store copies it into place, and buffers what a SET could not send
at once: at 64 MiB that held both directions to ~330-370 MB/s on loopback. Here the kernel copies
each byte once, straight into place (docs/benchmarks.md, "Notes"). Control commands (manifest,
delete, scan) stay on redis-py; this module only moves chunks.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
CRLF = b"\r\n"
MAX_LINE = 64 << 10  # longest status, error or length line accepted
SCRATCH_SIZE = 4096


class RespError(Exception):
    """The server answered a command with an error (``-OOM ...``, ``-WRONGPASS ...``)."""


@dataclass(frozen=True)
class RespAddress:
    """Where and as whom to connect: redis-py's parse of the store URL."""

    host: str
    port: int
    db: int = 0
    username: str | None = None
    password: str | None = None


def _command(*args: bytes) -> bytes:
    """A RESP array of bulk strings (small arguments only: they are joined here)."""
    return b"".join([b"*%d\r\n" % len(args), *(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)])


class RespConnection:
    """One socket; every await on it is bounded by ``io_timeout_s`` (TimeoutError)."""

    def __init__(self, sock: socket.socket, io_timeout_s: float) -> None:
        self._sock, self._timeout = sock, io_timeout_s
        self._loop = asyncio.get_running_loop()
        self._scratch = bytearray(SCRATCH_SIZE)
        self._pending = bytearray()  # received, not yet parsed

    @classmethod
    async def open(cls, address: RespAddress, connect_timeout_s: float,
                   io_timeout_s: float) -> RespConnection:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
        family, kind, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = cls(sock, io_timeout_s)
        try:
            async with asyncio.timeout(connect_timeout_s):
                await loop.sock_connect(sock, sockaddr)
            await connection._handshake(address)
        except BaseException:
            connection.close()
            raise
        return connection

    async def _handshake(self, address: RespAddress) -> None:
        commands = []
        if address.password is not None:
            user = () if address.username is None else (address.username.encode(),)
            commands.append(_command(b"AUTH", *user, address.password.encode()))
        if address.db:
            commands.append(_command(b"SELECT", str(address.db).encode()))
        if commands:
            await self._send(b"".join(commands))
            for _ in commands:
                await self._read_status()

    def close(self) -> None:
        self._sock.close()

    async def set_many(self, items: Sequence[tuple[bytes, memoryview]], ttl_ms: int) -> None:
        """``SET name value PX ttl_ms`` for every item, pipelined; values are sent from where
        they lie, never copied."""
        trailer = b"\r\n$2\r\nPX\r\n$%d\r\n%d\r\n" % (len(str(ttl_ms)), ttl_ms)
        for name, value in items:
            await self._send(b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (
                len(name), name, len(value)))
            await self._send(value)
            await self._send(trailer)
        for _ in items:
            await self._read_status()

    async def get_into(self, names: Sequence[bytes], views: Sequence[memoryview]) -> list[int]:
        """``GET name`` for every name, pipelined; reply i is received into ``views[i]``. ->
        each value's stored size (-1: no such key). A value longer than its view fills the view
        and the rest is dropped; the caller compares sizes."""
        await self._send(b"".join(_command(b"GET", name) for name in names))
        return [await self._read_bulk_into(view) for view in views]

    async def _send(self, data: bytes | memoryview) -> None:
        async with asyncio.timeout(self._timeout):
            await self._loop.sock_sendall(self._sock, data)

    async def _receive(self, into: memoryview) -> int:
        async with asyncio.timeout(self._timeout):
            n = await self._loop.sock_recv_into(self._sock, into)
        if n == 0:
            raise ConnectionResetError("the Redis server closed the connection")
        return n

    async def _read_line(self) -> bytes:
        while (end := self._pending.find(CRLF)) < 0:
            if len(self._pending) > MAX_LINE:
                raise ConnectionAbortedError("the Redis server sent an over-long reply line")
            n = await self._receive(memoryview(self._scratch))
            self._pending += self._scratch[:n]
        line = bytes(self._pending[:end])
        del self._pending[:end + 2]
        if line.startswith(b"-"):
            raise RespError(line[1:].decode(errors="replace"))
        return line

    async def _read_status(self) -> None:
        line = await self._read_line()
        if not line.startswith(b"+"):
            raise ConnectionAbortedError(f"unexpected Redis reply {line[:80]!r}")

    async def _read_bulk_into(self, view: memoryview) -> int:
        line = await self._read_line()
        if not line.startswith(b"$"):
            raise ConnectionAbortedError(f"unexpected Redis reply {line[:80]!r}")
        size = int(line[1:])
        if size < 0:
            return -1
        kept = min(size, len(view))
        buffered = min(len(self._pending), size)
        view[:min(buffered, kept)] = self._pending[:min(buffered, kept)]
        del self._pending[:buffered]
        got = buffered
        while got < kept:  # the kernel copies straight into place
            got += await self._receive(view[got:kept])
        while got < size:  # beyond the view: read and drop
            got += await self._receive(memoryview(self._scratch)[:size - got])
        while len(self._pending) < 2:
            n = await self._receive(memoryview(self._scratch))
            self._pending += self._scratch[:n]
        del self._pending[:2]  # CRLF after the payload
        return size


class RespPool:
    """Idle connections kept for reuse. A connection goes back to the pool only after an
    operation completed on it; one a failure or a cancel interrupted is closed, since its reply
    stream is no longer in step with its commands."""

    def __init__(self, address: RespAddress, connect_timeout_s: float, io_timeout_s: float,
                 max_idle: int) -> None:
        self._address, self._max_idle = address, max_idle
        self._timeouts = (connect_timeout_s, io_timeout_s)
        self._idle: list[RespConnection] = []

    async def run(self, operation: Callable[[RespConnection], Awaitable[T]]) -> T:
        """``operation`` on a pooled connection. A pooled connection the server dropped since
        (a restart) fails on first use; the operation is then run again, once, on a fresh one:
        every operation here is idempotent."""
        reused = bool(self._idle)
        connection = self._idle.pop() if reused else await self._connect()
        while True:
            try:
                result = await operation(connection)
            except ConnectionError:
                connection.close()
                if not reused:
                    raise
                reused, connection = False, await self._connect()
                continue
            except BaseException:
                connection.close()
                raise
            if len(self._idle) < self._max_idle:
                self._idle.append(connection)
            else:
                connection.close()
            return result

    async def _connect(self) -> RespConnection:
        return await RespConnection.open(self._address, *self._timeouts)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
