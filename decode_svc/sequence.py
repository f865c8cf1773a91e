"""Per-request decode state and the row table: plain bookkeeping, no torch."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from snapstream.finish import finish_reason
from snapstream.sampling_params import SamplingParams


@dataclass(frozen=True)
class DecodeEvent:
    """What the step loop tells a stream: one new token, or the end (finish reason or error)."""

    token_id: int | None = None
    finish_reason: str | None = None
    error: Exception | None = None  # the step failed: the stream ends with this error
    queue_s: float = 0.0  # submitted to admitted into a row
    decode_s: float = 0.0  # wall time from admission to this event
    simulated_s: float = 0.0  # the back end's simulated time over the same steps
    at: float = 0.0  # time.perf_counter() on the step loop when the event was made


@dataclass(frozen=True)
class StreamSink:
    """Where a sequence's events go: a queue read on ``loop``, the stream's asyncio event loop.
    The step loop hands all of one step's events for an event loop over in a single wake-up
    (:func:`decode_svc.loop.deliver`)."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[DecodeEvent]

    @classmethod
    def here(cls) -> StreamSink:
        """A sink read on the running event loop."""
        return cls(asyncio.get_running_loop(), asyncio.Queue())

    def drain(self) -> list[DecodeEvent]:
        """The events already queued (none if empty), without waiting."""
        events = []
        while not self.queue.empty():
            events.append(self.queue.get_nowait())
        return events


@dataclass
class Sequence:
    """A request inside the loop. ``replay`` holds known tokens still to be fed (the first token
    and, after a failover, the tokens already streamed); their outputs are not emitted."""

    request_id: str
    prompt_len: int
    next_position: int
    replay: deque[int]
    max_new_tokens: int
    emitted: int  # tokens the client has, counted against max_new_tokens
    sampling: SamplingParams
    stop_ids: frozenset[int]
    sink: StreamSink
    row: int = -1
    last_token: int = -1
    submitted_at: float = 0.0
    started_at: float = 0.0
    simulated_s: float = 0.0

    def next_input(self) -> int:
        return self.replay.popleft() if self.replay else self.last_token

    @property
    def is_replaying(self) -> bool:
        return bool(self.replay)

    def finish_reason(self, token: int) -> str | None:
        """:func:`snapstream.finish.finish_reason` of ``token``, the ``emitted``-th."""
        return finish_reason(token, self.emitted, self.stop_ids, self.max_new_tokens)


class RowTable:
    """Which rows of a fixed pool are busy, and with which sequence."""

    def __init__(self, num_rows: int) -> None:
        self.rows: list[Sequence | None] = [None] * num_rows

    @property
    def active(self) -> list[Sequence]:
        return [seq for seq in self.rows if seq is not None]

    def allocate(self, seq: Sequence) -> bool:
        if None not in self.rows:
            return False
        seq.row = self.rows.index(None)
        self.rows[seq.row] = seq
        return True

    def holds(self, seq: Sequence) -> bool:
        return 0 <= seq.row < len(self.rows) and self.rows[seq.row] is seq

    def release(self, seq: Sequence) -> None:
        if self.holds(seq):
            self.rows[seq.row] = None
