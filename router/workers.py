"""Worker pools: addresses (a list, or DNS names resolving to many) -> channels, and the
routing policies that pick one (least outstanding for prefill, most free rows for decode)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from serving.errors import Unavailable
from serving.server import CHANNEL_OPTIONS
from serving.tls import TlsFiles, open_channel
from snapstream.v1 import decode_pb2

log = logging.getLogger(__name__)
FAILED_BACKOFF_S = 2.0


@dataclass
class Worker:
    address: str
    channel: grpc.aio.Channel
    stub: object
    outstanding: int = 0
    free_rows: int = 0
    failed_until: float = 0.0
    model_fingerprint: str = ""  # hex, from the decode worker's Stats ("" until polled)

    @property
    def is_available(self) -> bool:
        return time.monotonic() >= self.failed_until

    def mark_failed(self) -> None:
        self.failed_until = time.monotonic() + FAILED_BACKOFF_S


ROUTING: dict[str, Callable[[Worker], tuple]] = {
    "least_outstanding": lambda w: (w.outstanding,),
    "most_free_rows": lambda w: (-(w.free_rows - w.outstanding), w.outstanding),
}


def _resolve(address: str) -> list[str]:
    host, _, port = address.rpartition(":")
    try:
        infos = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return sorted({f"{info[4][0]}:{port}" for info in infos})


class WorkerPool:
    """Channels to the workers: mutual TLS with ``tls`` (this service's certificate as the
    client's), else plaintext."""

    def __init__(self, name: str, addresses: tuple[str, ...], stub_cls, routing: str,
                 tls: TlsFiles | None = None) -> None:
        if not addresses:
            raise ValueError(f"no {name} worker addresses given")
        self.name, self.addresses, self.stub_cls, self.tls = name, addresses, stub_cls, tls
        self.score = ROUTING[routing]
        self.workers: dict[str, Worker] = {}

    async def refresh(self) -> None:
        """Re-resolves the addresses; keeps the channels of workers that are still listed."""
        resolved = {ip for address in self.addresses
                    for ip in await asyncio.to_thread(_resolve, address)}
        for gone in set(self.workers) - resolved:
            await self.workers.pop(gone).channel.close()
        for address in sorted(resolved - set(self.workers)):
            channel = open_channel(address, self.tls, CHANNEL_OPTIONS)
            channel.get_state(try_to_connect=True)  # connects now, not on the first request
            self.workers[address] = Worker(address, channel, self.stub_cls(channel))

    def is_reachable(self) -> bool:
        """Whether a connection to at least one worker is up (asks idle channels to connect)."""
        return any(worker.channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY
                   for worker in self.workers.values())

    def model_fingerprint(self) -> str:
        """The fingerprint every polled worker reports; "" before the first poll, or when the
        workers serve different models (a misconfiguration: their blobs would be refused)."""
        reported = {w.model_fingerprint for w in self.workers.values() if w.model_fingerprint}
        return reported.pop() if len(reported) == 1 else ""

    def pick(self, exclude: set[str] = frozenset()) -> Worker:
        candidates = [w for w in self.workers.values()
                      if w.address not in exclude and w.is_available]
        if not candidates:
            raise Unavailable(f"no {self.name} worker available (tried {sorted(exclude)} of "
                              f"{sorted(self.workers)}); retry later")
        return min(candidates, key=self.score)

    @contextlib.contextmanager
    def track(self, worker: Worker):
        worker.outstanding += 1
        try:
            yield worker
        finally:
            worker.outstanding -= 1

    async def close(self) -> None:
        for worker in self.workers.values():
            await worker.channel.close()


async def poll_decode_stats(pool: WorkerPool, interval_s: float, resolve_every_s: float) -> None:
    """Background task: free rows of every decode worker, and periodic DNS re-resolution."""
    last_resolve = time.monotonic()
    while True:
        if time.monotonic() - last_resolve > resolve_every_s:
            await pool.refresh()
            last_resolve = time.monotonic()
        for worker in list(pool.workers.values()):
            try:
                stats = await worker.stub.Stats(decode_pb2.StatsRequest(), timeout=interval_s)
                worker.free_rows = stats.free_rows - stats.queue_depth
                worker.model_fingerprint = stats.model_fingerprint
            except grpc.aio.AioRpcError:
                worker.free_rows = 0
        await asyncio.sleep(interval_s)
