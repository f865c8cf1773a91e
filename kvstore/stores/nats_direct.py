"""The NATS store's chunk path: JetStream publishes and direct gets over a
:class:`~kvstore.stores.sockets.BulkSocket`, payloads sent from where they lie and received
straight into place.

nats-py reads 32 KiB at a time through the asyncio stream and copies a message's payload into
its parser's buffer and out into a new ``bytes`` before the store copies it into the blob, and
joins every published payload with its protocol line into a new ``bytes``: a 64 MiB get stayed
at ~250-440 MB/s on loopback, and puts depended on how malloc happened to recycle those
megabyte buffers. Here the kernel copies each byte once (docs/benchmarks.md, "Serving").
Purges, manifests and stream management stay on nats-py.

Protocol (NATS client protocol with headers): ``SUB <inbox>.* 1`` once per connection, then per
chunk either ``PUB <chunk subject> <inbox>.<i>`` with the payload, answered by the JetStream ack
``{"stream": ..., "seq": ...}`` (or ``{"error": ...}``), or ``PUB $JS.API.DIRECT.GET.<stream>
<inbox>.<i>`` with ``{"last_by_subj": subject}``, answered by ``HMSG <inbox>.<i> 1 <header
bytes> <total bytes>`` whose header status is empty (found) or ``404`` (no message).
"""

from __future__ import annotations

import json
import secrets
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvstore.stores.sockets import CRLF, BulkSocket

T = TypeVar("T")
NOT_FOUND = b"404"
NOWHERE = memoryview(bytearray())  # where a payload to drop is read to


class NatsError(Exception):
    """The server sent ``-ERR`` or answered a direct get with an error status."""


@dataclass(frozen=True)
class NatsAddress:
    """Where and as whom to connect: the server nats-py is connected to, with the URL's user
    and password (or token, a user without a password, as nats-py reads it)."""

    host: str
    port: int
    user: str | None = None
    password: str | None = None
    tls: ssl.SSLContext | None = None  # tls://: TLS after the server's plaintext INFO

    def credentials(self) -> dict[str, str]:
        if self.user is None:
            return {}
        if self.password is None:
            return {"auth_token": self.user}
        return {"user": self.user, "pass": self.password}


class JetStreamConnection:
    def __init__(self, sock: BulkSocket, stream: str) -> None:
        self._sock = sock
        self._api = f"$JS.API.DIRECT.GET.{stream}".encode()
        self._inbox = b"_INBOX." + secrets.token_hex(11).encode()

    @classmethod
    async def open(cls, address: NatsAddress, stream: str, connect_timeout_s: float,
                   io_timeout_s: float) -> JetStreamConnection:
        async def setup(sock: BulkSocket) -> JetStreamConnection:
            connection = cls(sock, stream)
            await connection._handshake(address)
            return connection

        return await BulkSocket.open(address.host, address.port, connect_timeout_s,
                                     io_timeout_s, setup)

    async def _handshake(self, address: NatsAddress) -> None:
        """INFO in, CONNECT + SUB + PING out; the PONG says both were accepted."""
        info = await self._sock.read_line()
        if not info.startswith(b"INFO "):
            raise ConnectionAbortedError(f"not a NATS server: {info[:80]!r}")
        if address.tls is not None:
            await self._sock.start_tls(address.tls, address.host)
        options = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True,
                   "protocol": 1, "lang": "python", "version": "snapstream-direct-get",
                   **address.credentials()}
        await self._sock.send(b"CONNECT %s\r\nSUB %s.* 1\r\nPING\r\n" % (
            json.dumps(options).encode(), self._inbox))
        while (line := await self._sock.read_line()) != b"PONG":
            await self._control(line)

    def close(self) -> None:
        self._sock.close()

    async def publish_many(self, items: Sequence[tuple[str, memoryview]]) -> None:
        """Publish every ``(subject, payload)`` to its JetStream stream, pipelined, and wait for
        every ack; payloads are sent from where they lie, never copied."""
        for index, (subject, payload) in enumerate(items):
            await self._sock.send(b"PUB %s %s.%d %d\r\n" % (
                subject.encode(), self._inbox, index, len(payload)))
            await self._sock.send(payload)
            await self._sock.send(CRLF)
        await self._replies(len(items), self._receive_ack)

    async def get_into(self, subjects: Sequence[str], views: Sequence[memoryview]) -> list[int]:
        """The last message on each subject, pipelined; message i is received into
        ``views[i]``. -> each message's size (-1: none on the subject). A message longer than
        its view fills the view and the rest is dropped; the caller compares sizes."""
        requests = []
        for index, subject in enumerate(subjects):
            body = json.dumps({"last_by_subj": subject}).encode()
            requests.append(b"PUB %s %s.%d %d\r\n%s\r\n" % (
                self._api, self._inbox, index, len(body), body))
        await self._sock.send(b"".join(requests))

        async def receive(index: int, status: bytes | None, size: int) -> int:
            if status == NOT_FOUND:
                await self._sock.read_into(NOWHERE, size)
                return -1
            if status is not None:
                raise NatsError(f"direct get of {subjects[index]}: status {status.decode()}")
            await self._sock.read_into(views[index], size)
            return size

        return await self._replies(len(subjects), receive)

    async def _receive_ack(self, index: int, status: bytes | None, size: int) -> None:
        body = await self._sock.read_bytes(size)
        if status is not None:  # 503: no stream takes the subject
            raise NatsError(f"publish: status {status.decode()}")
        ack = json.loads(body)
        if "error" in ack:
            raise NatsError(f"publish: {ack['error'].get('description', ack['error'])}")

    async def _replies(self, count: int, receive: Callable[[int, bytes | None, int],
                                                           Awaitable[T]]) -> list[T]:
        """The replies to requests ``<inbox>.0 .. <inbox>.<count - 1>``, in any order; each
        message's payload is consumed by ``receive(index, header status or None, size)``."""
        results: dict[int, T] = {}
        while len(results) < count:
            line = await self._sock.read_line()
            if not line.startswith((b"MSG ", b"HMSG ")):
                await self._control(line)
                continue
            reply_to, header_len, total_len = _parse_message_line(line)
            index = int(reply_to.rsplit(b".", 1)[1])
            if not 0 <= index < count or index in results:
                raise ConnectionAbortedError(f"unexpected NATS reply {line[:80]!r}")
            status = (await self._sock.read_bytes(header_len)).split(CRLF, 1)[0].split()[1:2]
            results[index] = await receive(index, status[0] if status else None,
                                           total_len - header_len)
            await self._sock.read_bytes(2)  # CRLF after the payload
        return [results[index] for index in range(count)]

    async def _control(self, line: bytes) -> None:
        """A protocol line other than a message: answer PING, ignore news, raise -ERR."""
        op = line.split(b" ", 1)[0]
        if op == b"-ERR":
            raise NatsError(line[5:].decode(errors="replace").strip(" '"))
        if op == b"PING":
            await self._sock.send(b"PONG\r\n")
        elif op not in (b"PONG", b"+OK", b"INFO"):
            raise ConnectionAbortedError(f"unexpected NATS protocol line {line[:80]!r}")


def _parse_message_line(line: bytes) -> tuple[bytes, int, int]:
    """``MSG <subject> <sid> [reply-to] <bytes>`` or ``HMSG <subject> <sid> [reply-to] <header
    bytes> <total bytes>`` -> the message's subject (our inbox), header and total sizes."""
    fields = line.split()
    with_headers = fields[0] == b"HMSG"
    if len(fields) - with_headers not in (4, 5):
        raise ConnectionAbortedError(f"malformed NATS message line {line[:80]!r}")
    return fields[1], int(fields[-2]) if with_headers else 0, int(fields[-1])
