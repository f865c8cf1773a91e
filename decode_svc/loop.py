"""The step loop, on its own thread: admit -> step -> emit, over one static pool per layout.

Streams talk to it through :meth:`DecodeLoop.submit` / :meth:`DecodeLoop.cancel` (thread-safe)
and receive :class:`DecodeEvent` through the :class:`StreamSink` each sequence carries: each
step's events reach each asyncio event loop in one wake-up, not one per token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from decode_svc.backends import SN40LSimBackend, TorchBackend
from decode_svc.sequence import DecodeEvent, RowTable, Sequence, StreamSink
from serving import metrics
from serving.errors import QueueFull
from snapstream.decode import Decoder
from snapstream.engine import Engine
from snapstream.kvcache import ModelLayout, SequenceCache, pool_row_bytes
from snapstream.memory_plan import DecodeMemory
from snapstream.policy import CacheLayout
from snapstream.sampling import sample_row

log = logging.getLogger(__name__)


@dataclass
class Pool:
    decoder: Decoder
    table: RowTable


@dataclass(frozen=True)
class LoopStats:
    total_rows: int
    free_rows: int
    running: int
    queue_depth: int


class DecodeLoop:
    def __init__(self, engine: Engine, backend: TorchBackend | SN40LSimBackend, rows: int,
                 max_queue: int, max_pools: int = 4, memory: DecodeMemory | None = None
                 ) -> None:
        self.engine, self.backend = engine, backend
        self.rows, self.max_queue, self.max_pools = rows, max_queue, max_pools
        self.memory = memory  # None: every pool is made
        self.pools: dict[CacheLayout, Pool] = {}
        self.waiting: deque[tuple[Sequence, SequenceCache]] = deque()
        self.cancelled: set[str] = set()
        self.lock = threading.Condition()
        self.running = 0
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="decode-loop", daemon=True)

    # -- called from the gRPC event loop -------------------------------------------------------
    def submit(self, seq: Sequence, cache: SequenceCache) -> None:
        with self.lock:
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(f"decode queue is full ({self.max_queue} waiting); retry later")
            seq.submitted_at = time.monotonic()
            self.waiting.append((seq, cache))
            metrics.WAITING.labels("decode").set(len(self.waiting))
            self.lock.notify()

    def cancel(self, request_id: str) -> None:
        with self.lock:
            self.cancelled.add(request_id)
            self.lock.notify()

    def stats(self) -> LoopStats:
        with self.lock:
            return LoopStats(self.rows, self.rows - self.running, self.running,
                             len(self.waiting))

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.lock.notify()
        self.thread.join()

    # -- the loop thread ------------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self.lock:
                while not self.stopped and not self.running and not self.waiting:
                    self.lock.wait()
                if self.stopped:
                    return
                self._drop_cancelled()
                failed = self._admit()
            deliver(failed)
            for pool in list(self.pools.values()):
                if pool.table.active:
                    try:
                        self._step(pool)
                    except Exception as exc:
                        log.exception("decode step failed")
                        self._fail(pool, exc)

    def _drop_cancelled(self) -> None:
        if not self.cancelled:
            return
        self.waiting = deque((s, c) for s, c in self.waiting if s.request_id not in self.cancelled)
        for pool in self.pools.values():
            for seq in pool.table.active:
                if seq.request_id in self.cancelled:
                    self._release(pool, seq)
        self.cancelled.clear()

    def _admit(self) -> list[tuple[StreamSink, DecodeEvent]]:
        """Moves waiting sequences into free rows; -> the error events of those that could not
        be placed (each ends alone)."""
        still_waiting: deque[tuple[Sequence, SequenceCache]] = deque()
        failed = []
        while self.waiting:
            seq, cache = self.waiting.popleft()
            try:
                pool = self._pool_for(cache.layout) if self.running < self.rows else None
                if pool is None or not pool.table.allocate(seq):
                    still_waiting.append((seq, cache))
                    continue
                self.running += 1
                pool.decoder.cache.insert(seq.row, cache)
            except Exception as exc:
                log.exception("placing %s into its row failed", seq.request_id)
                if seq.row >= 0:
                    self._release(pool, seq)
                failed.append((seq.sink, DecodeEvent(error=exc, at=time.perf_counter())))
                continue
            seq.started_at = time.monotonic()
            metrics.QUEUE_TIME.labels("decode").observe(seq.started_at - seq.submitted_at)
        self.waiting = still_waiting
        metrics.WAITING.labels("decode").set(len(self.waiting))
        metrics.RUNNING.labels("decode").set(self.running)
        metrics.ROW_OCCUPANCY.set(self.running / self.rows)
        return failed

    def _pool_for(self, layout: CacheLayout) -> Pool | None:
        if layout not in self.pools:
            idle = [key for key, pool in self.pools.items() if not pool.table.active]
            if len(self.pools) >= self.max_pools and not idle:
                return None
            if len(self.pools) >= self.max_pools:
                del self.pools[idle[0]]
            if self.memory is not None:  # MemoryExhausted ends this request alone
                self.memory.check_pools(sum(map(self._pool_bytes, self.pools)),
                                        self._pool_bytes(layout))
            self.pools[layout] = Pool(self.engine.new_decoder(layout, self.rows),
                                      RowTable(self.rows))
        return self.pools[layout]

    def _pool_bytes(self, layout: ModelLayout) -> int:
        return self.rows * pool_row_bytes(self.engine.config, layout, self.engine.kv_dtype)

    def _step(self, pool: Pool) -> None:
        active = pool.table.active
        batch = pool.decoder.step_rows(max(seq.row for seq in active) + 1)
        tokens, positions = [0] * batch, [0] * batch
        for seq in active:
            tokens[seq.row], positions[seq.row] = seq.next_input(), seq.next_position
        start = time.perf_counter()
        logits, simulated_s = self.backend.step(
            pool.decoder, torch.tensor(tokens, device=self.engine.device),
            torch.tensor(positions, device=self.engine.device))
        emitting = []
        for seq in active:
            seq.next_position += 1
            seq.simulated_s += simulated_s
            if not seq.is_replaying:
                emitting.append(seq)
        greedy = logits.argmax(dim=-1).tolist()  # one host sync for every greedy row
        events = [(seq.sink, self._next_event(pool, seq, logits, greedy)) for seq in emitting]
        metrics.STEP_TIME.observe(time.perf_counter() - start)
        metrics.STEP_ROWS.observe(batch)
        if simulated_s:
            metrics.SIM_STEP_TIME.observe(simulated_s)
        deliver(events)

    def _next_event(self, pool: Pool, seq: Sequence, logits: torch.Tensor, greedy: list[int]
                    ) -> DecodeEvent:
        """Samples and emits one row's token; a failure (sampling, stop handling) ends that
        sequence alone, never its neighbours in the batch."""
        try:
            token = greedy[seq.row] if seq.sampling.is_greedy else sample_row(
                logits[seq.row], seq.sampling, seq.next_position)
            return self._emit(pool, seq, token)
        except Exception as exc:
            log.exception("decoding %s failed; its neighbours go on", seq.request_id)
            with self.lock:
                self._release(pool, seq)
            return DecodeEvent(error=exc, at=time.perf_counter())

    def _emit(self, pool: Pool, seq: Sequence, token: int) -> DecodeEvent:
        now, at = time.monotonic(), time.perf_counter()
        seq.last_token = token
        seq.emitted += 1
        reason = seq.finish_reason(token)
        if reason is not None:
            with self.lock:
                self._release(pool, seq)
        return DecodeEvent(token_id=token, finish_reason=reason,
                           queue_s=seq.started_at - seq.submitted_at,
                           decode_s=now - seq.started_at, simulated_s=seq.simulated_s, at=at)

    def _fail(self, pool: Pool, exc: Exception) -> None:
        with self.lock:
            failed = pool.table.active
            for seq in failed:
                self._release(pool, seq)
        deliver([(seq.sink, DecodeEvent(error=exc, at=time.perf_counter())) for seq in failed])

    def _release(self, pool: Pool, seq: Sequence) -> None:
        """Frees the sequence's row (a no-op when it holds none)."""
        if not pool.table.holds(seq):
            return
        pool.table.release(seq)
        pool.decoder.cache.clear(seq.row)
        self.running -= 1
        metrics.RUNNING.labels("decode").set(self.running)
        metrics.ROW_OCCUPANCY.set(self.running / self.rows)


def deliver(events: list[tuple[StreamSink, DecodeEvent]]) -> None:
    """Puts each event on its sink's queue, in order, with one ``call_soon_threadsafe`` per
    event loop (each is a wake-up and a system call; a step of B sequences would make B)."""
    batches: dict[asyncio.AbstractEventLoop, list[tuple[StreamSink, DecodeEvent]]] = {}
    for sink, event in events:
        batches.setdefault(sink.loop, []).append((sink, event))
    for aio, batch in batches.items():
        aio.call_soon_threadsafe(_put_all, batch)


def _put_all(batch: list[tuple[StreamSink, DecodeEvent]]) -> None:
    for sink, event in batch:
        sink.queue.put_nowait(event)
