"""Plain-socket connections for the stores' chunk paths, and a pool of them.

The asyncio stream and the client libraries buffer every received byte at least twice before a
chunk reaches its place in a blob; a :class:`BulkSocket` receives a payload by asking the kernel
to copy it straight into the destination view, and sends a payload from where it lies. Every
await on a socket is bounded by ``io_timeout_s`` (TimeoutError); a server that closes the
connection raises ConnectionResetError.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")
CRLF = b"\r\n"
MAX_LINE = 64 << 10  # longest protocol line accepted
SCRATCH_SIZE = 4096
TLS_WRITE = 1 << 20  # plaintext handed to the TLS layer at once (its ciphertext is buffered)
TLS_READ = 256 << 10  # ciphertext received at once


class BulkSocket:
    """Over TLS (:meth:`start_tls`) each payload is still sent from where it lies and decrypted
    straight into place, through an ``ssl.SSLObject`` between the socket and memory BIOs."""

    def __init__(self, sock: socket.socket, io_timeout_s: float) -> None:
        self._sock, self._timeout = sock, io_timeout_s
        self._loop = asyncio.get_running_loop()
        self._scratch = bytearray(SCRATCH_SIZE)
        self._pending = bytearray()  # received, not yet consumed
        self._tls: ssl.SSLObject | None = None
        self._tls_in, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()

    @classmethod
    async def open(cls, host: str, port: int, connect_timeout_s: float, io_timeout_s: float,
                   setup: Callable[[BulkSocket], Awaitable[T]]) -> T:
        """Connect to the first of the host's addresses that accepts (``localhost`` may name
        ::1 before 127.0.0.1), then ``setup(socket)`` (the protocol's handshake) -> what it
        returns; the socket is closed when either fails."""
        async with asyncio.timeout(connect_timeout_s):
            sock = await _connect(host, port)
        try:
            return await setup(cls(sock, io_timeout_s))
        except BaseException:
            sock.close()
            raise

    def close(self) -> None:
        self._sock.close()

    async def start_tls(self, context: ssl.SSLContext, server_hostname: str) -> None:
        """The TLS handshake; from now on every byte is encrypted (Redis: at once; NATS: after
        the server's plaintext INFO)."""
        if self._pending:
            raise ConnectionAbortedError("the server sent data before the TLS handshake")
        self._tls = context.wrap_bio(self._tls_in, self._tls_out,
                                     server_hostname=server_hostname)
        async with asyncio.timeout(self._timeout):
            while True:
                try:
                    self._tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    await self._flush_tls()
                    await self._receive_tls()
            await self._flush_tls()

    async def send(self, data: bytes | memoryview) -> None:
        async with asyncio.timeout(self._timeout):
            if self._tls is None:
                await self._loop.sock_sendall(self._sock, data)
                return
            view = memoryview(data).cast("B")
            for start in range(0, len(view), TLS_WRITE):
                self._tls.write(view[start:start + TLS_WRITE])
                await self._flush_tls()

    async def read_line(self) -> bytes:
        """The next line, without its CRLF."""
        while (end := self._pending.find(CRLF)) < 0:
            if len(self._pending) > MAX_LINE:
                raise ConnectionAbortedError("the server sent an over-long protocol line")
            await self._fill()
        line = bytes(self._pending[:end])
        del self._pending[:end + 2]
        return line

    async def read_into(self, view: memoryview, size: int) -> None:
        """The next ``size`` bytes: the first ``len(view)`` into ``view``, the rest dropped."""
        kept = min(size, len(view))
        buffered = min(len(self._pending), size)
        view[:min(buffered, kept)] = self._pending[:min(buffered, kept)]
        del self._pending[:buffered]
        got = buffered
        while got < kept:  # the kernel copies straight into place
            got += await self._receive(view[got:kept])
        while got < size:
            got += await self._receive(memoryview(self._scratch)[:size - got])

    async def read_bytes(self, size: int) -> bytes:
        """The next ``size`` bytes (small ones: headers, trailers)."""
        while len(self._pending) < size:
            await self._fill()
        data = bytes(self._pending[:size])
        del self._pending[:size]
        return data

    async def _fill(self) -> None:
        n = await self._receive(memoryview(self._scratch))
        self._pending += self._scratch[:n]

    async def _receive(self, into: memoryview) -> int:
        async with asyncio.timeout(self._timeout):
            if self._tls is None:
                n = await self._loop.sock_recv_into(self._sock, into)
            else:
                n = await self._decrypt_into(into)
        if n == 0:
            raise ConnectionResetError("the server closed the connection")
        return n

    async def _decrypt_into(self, into: memoryview) -> int:
        while True:
            try:
                return self._tls.read(len(into), into)
            except ssl.SSLWantReadError:
                await self._receive_tls()
            except ssl.SSLZeroReturnError:
                return 0

    async def _receive_tls(self) -> None:
        data = await self._loop.sock_recv(self._sock, TLS_READ)
        if not data:
            raise ConnectionResetError("the server closed the connection")
        self._tls_in.write(data)

    async def _flush_tls(self) -> None:
        if self._tls_out.pending:
            await self._loop.sock_sendall(self._sock, self._tls_out.read())


async def _connect(host: str, port: int) -> socket.socket:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError = ConnectionRefusedError(f"{host}:{port} has no address")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    raise error


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


class ConnectionPool(Generic[C]):
    """Idle connections kept for reuse. A connection goes back to the pool only after an
    operation completed on it; one a failure or a cancel interrupted is closed, since its
    replies are no longer in step with its requests."""

    def __init__(self, connect: Callable[[], Awaitable[C]], max_idle: int) -> None:
        self._connect, self._max_idle = connect, max_idle
        self._idle: list[C] = []

    async def run(self, operation: Callable[[C], Awaitable[T]]) -> T:
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

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


def client_tls(ca_file: str | None) -> ssl.SSLContext:
    """A client context that checks the server's certificate and name against ``ca_file``
    (a PEM CA; None: the system's CAs)."""
    return ssl.create_default_context(cafile=ca_file)
