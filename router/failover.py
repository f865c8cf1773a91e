"""Failover of one request's decode stream: which decode workers it tried, what a broken stream
means, and how long to wait before the full and gone workers are tried again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc

from router.workers import Worker
from serving import metrics
from serving.errors import QueueFull, Unavailable

log = logging.getLogger(__name__)
# a decode stream that ends with one of these is resumed on another decode worker
FAILOVER_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN,
                  grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED}
# every decode worker left to try is full or gone (it refused the sequence for a full queue,
# or died and may be restarted): wait, then try them again; each wait doubles, and past the
# last one (~30 s in all) the request ends RESOURCE_EXHAUSTED (or UNAVAILABLE)
DECODE_RETRY_WAITS_S = (0.05, 0.1, 0.2, 0.4, 0.8, *(1.0,) * 28)


class BlobRejected(Unavailable):
    """The decode worker rejected the request's blob (it failed its MAC or its checks, and was
    deleted): prefilled again once, then UNAVAILABLE with a retry hint."""


@dataclass
class DecodeAttempts:
    """The decode workers one request tried (addresses), each left out of the next pick. Those
    ``full`` (refused for a full queue: the blob stays) and ``gone`` (unreachable or died
    mid-stream: may be back after a restart) come back after each :meth:`wait`; a worker that
    failed otherwise does not."""

    request_id: str
    tried: set[str] = field(default_factory=set)
    full: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    waits: Iterator[float] = field(default_factory=lambda: iter(DECODE_RETRY_WAITS_S))
    prefilled_again: bool = False  # after a rejected blob

    def broke(self, worker: Worker, err: grpc.aio.AioRpcError, tokens_sent: int) -> None:
        """A stream from ``worker`` ended with ``err`` after ``tokens_sent`` tokens: returns when
        another worker may take the stream, raises when the request ends here (Unavailable when
        the store lost the blob, BlobRejected when the worker rejected it, ``err`` itself when its
        code is not one to fail over on)."""
        code = err.code()
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            self.full.add(worker.address)
            self.tried.add(worker.address)
            return
        if code == grpc.StatusCode.NOT_FOUND:
            # the store lost the blob (a restart without persistence, its TTL): nothing the
            # client asked for is missing, so it may retry
            raise Unavailable(f"the request's KV cache is gone from the store "
                              f"({err.details()}); retry the request") from err
        if code == grpc.StatusCode.DATA_LOSS:
            log.warning("decode worker %s rejected the blob of %s: %s", worker.address,
                        self.request_id, err.details())
            raise BlobRejected(f"the request's KV cache failed its checks ({err.details()}); "
                               "retry the request") from err
        if code not in FAILOVER_CODES:
            raise err
        log.warning("decode worker %s failed (%s); resuming %s after %d tokens",
                    worker.address, code.name, self.request_id, tokens_sent)
        metrics.FAILOVERS.inc()
        worker.mark_failed()
        self.tried.add(worker.address)
        if code == grpc.StatusCode.UNAVAILABLE:
            self.gone.add(worker.address)

    async def wait(self, deadline: float | None) -> None:
        """No worker could be picked: sleeps the next wait, then lets the full and gone workers
        be tried again. When the waits are used up or the deadline would pass first: QueueFull
        if some were full, else Unavailable."""
        wait_s = next(self.waits, None)
        if wait_s is None or (deadline is not None and time.monotonic() + wait_s >= deadline):
            total_s = sum(DECODE_RETRY_WAITS_S)
            if self.full:
                raise QueueFull(f"every decode worker's queue is full ({len(self.full)} tried, "
                                f"for {total_s:.0f} s); retry later")
            raise Unavailable(f"no decode worker could take the stream within {total_s:.0f} s; "
                              "retry later")
        await asyncio.sleep(wait_s)
        self.tried -= self.full | self.gone
        self.full.clear()
