"""The Redis store's chunk path: RESP2 over a :class:`~kvstore.stores.sockets.BulkSocket`.

redis-py (with hiredis) reads a bulk reply through the asyncio stream buffer, the parser's buffer
and a new ``bytes`` before the store copies it into place, and buffers what a SET could not send
at once: at 64 MiB that held both directions to ~330-370 MB/s on loopback. Here the kernel copies
each byte once, straight into place (docs/benchmarks.md, "Serving"). Control commands (manifest,
delete, scan) stay on redis-py; this module only moves chunks.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.stores.sockets import BulkSocket


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
    tls: ssl.SSLContext | None = None  # rediss://: TLS from the first byte


def _command(*args: bytes) -> bytes:
    """A RESP array of bulk strings (small arguments only: they are joined here)."""
    return b"".join([b"*%d\r\n" % len(args), *(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)])


class RespConnection:
    def __init__(self, sock: BulkSocket) -> None:
        self._sock = sock

    @classmethod
    async def open(cls, address: RespAddress, connect_timeout_s: float,
                   io_timeout_s: float) -> RespConnection:
        async def setup(sock: BulkSocket) -> RespConnection:
            if address.tls is not None:
                await sock.start_tls(address.tls, address.host)
            connection = cls(sock)
            await connection._handshake(address)
            return connection

        return await BulkSocket.open(address.host, address.port, connect_timeout_s,
                                     io_timeout_s, setup)

    async def _handshake(self, address: RespAddress) -> None:
        """Log in and select the database, as redis-py does on its connections."""
        commands = []
        if address.password is not None:
            user = () if address.username is None else (address.username.encode(),)
            commands.append(_command(b"AUTH", *user, address.password.encode()))
        if address.db:
            commands.append(_command(b"SELECT", str(address.db).encode()))
        if commands:
            await self._sock.send(b"".join(commands))
            for _ in commands:
                await self._read_status()

    def close(self) -> None:
        self._sock.close()

    async def set_many(self, items: Sequence[tuple[bytes, memoryview]], ttl_ms: int) -> None:
        """``SET name value PX ttl_ms`` for every item, pipelined; values are sent from where
        they lie, never copied."""
        trailer = b"\r\n$2\r\nPX\r\n$%d\r\n%d\r\n" % (len(str(ttl_ms)), ttl_ms)
        for name, value in items:
            await self._sock.send(b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (
                len(name), name, len(value)))
            await self._sock.send(value)
            await self._sock.send(trailer)
        for _ in items:
            await self._read_status()

    async def get_into(self, names: Sequence[bytes], views: Sequence[memoryview]) -> list[int]:
        """``GET name`` for every name, pipelined; reply i is received into ``views[i]``. ->
        each value's stored size (-1: no such key). A value longer than its view fills the view
        and the rest is dropped; the caller compares sizes."""
        await self._sock.send(b"".join(_command(b"GET", name) for name in names))
        return [await self._read_bulk_into(view) for view in views]

    async def _read_reply_line(self) -> bytes:
        line = await self._sock.read_line()
        if line.startswith(b"-"):
            raise RespError(line[1:].decode(errors="replace"))
        return line

    async def _read_status(self) -> None:
        line = await self._read_reply_line()
        if not line.startswith(b"+"):
            raise ConnectionAbortedError(f"unexpected Redis reply {line[:80]!r}")

    async def _read_bulk_into(self, view: memoryview) -> int:
        line = await self._read_reply_line()
        if not line.startswith(b"$"):
            raise ConnectionAbortedError(f"unexpected Redis reply {line[:80]!r}")
        size = int(line[1:])
        if size < 0:
            return -1
        await self._sock.read_into(view, size)
        await self._sock.read_bytes(2)  # CRLF after the payload
        return size
