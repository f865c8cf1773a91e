"""How tokens travel from the step loop to the streams: one wake-up per event loop per step,
and a router chunk that stops at the token completing a stop string."""

from __future__ import annotations

import asyncio
import threading

from decode_svc.loop import deliver
from decode_svc.sequence import DecodeEvent, StreamSink
from router.flow import TextChunk, until_stop
from router.text import TextStream
from tests.tiny_models import tiny_snapstream_tokenizer


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the wake-ups other threads ask of it."""

    wakeups = 0

    def call_soon_threadsafe(self, *args, **kwargs):
        self.wakeups += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def test_one_step_wakes_each_event_loop_once_and_keeps_the_order():
    async def scenario() -> tuple[list[int], list[int], int]:
        first, second = StreamSink.here(), StreamSink.here()
        events = [(first, DecodeEvent(token_id=1)), (second, DecodeEvent(token_id=2)),
                  (first, DecodeEvent(token_id=3, finish_reason="length"))]
        thread = threading.Thread(target=deliver, args=(events,))  # as the step loop does
        thread.start()
        thread.join()
        await asyncio.sleep(0)  # the delivery callback runs
        return ([e.token_id for e in first.drain()], [e.token_id for e in second.drain()],
                asyncio.get_running_loop().wakeups)

    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        got_first, got_second, wakeups = runner.run(scenario())
    assert got_first == [1, 3]
    assert got_second == [2]
    assert wakeups == 1


def test_drain_takes_only_what_is_queued():
    async def scenario() -> tuple[list[DecodeEvent], list[DecodeEvent]]:
        sink = StreamSink.here()
        empty = sink.drain()
        for token in (5, 6):
            sink.queue.put_nowait(DecodeEvent(token_id=token))
        return empty, sink.drain()

    empty, queued = asyncio.run(scenario())
    assert empty == []
    assert [e.token_id for e in queued] == [5, 6]


def test_a_chunk_ends_at_the_token_that_completes_a_stop_string():
    tokenizer = tiny_snapstream_tokenizer()
    text = TextStream(tokenizer, stop=("lo w",))
    tokens = tokenizer.encode("hello world")
    chunk = until_stop(tokens, text)
    assert chunk.token_ids == tuple(tokens[: len("hello w") - 1])  # "he": one tiny token
    assert chunk.text == "hel" and text.stopped


def test_a_chunk_without_a_stop_string_keeps_every_token():
    tokenizer = tiny_snapstream_tokenizer()
    text = TextStream(tokenizer, stop=("xyz",))
    tokens = tokenizer.encode("héllo")  # é is two bytes: whole in one chunk
    assert until_stop(tokens, text) == TextChunk(tuple(tokens), "héllo")
