"""The serving path without gRPC and without the KV store: the baseline of `bench serve`.

Prefills run one at a time on their own thread (as in the prefill worker), decoding runs in a
:class:`~decode_svc.loop.DecodeLoop` with the same rows (as in a decode worker), and the first
token is replayed through the loop as the decode worker does. TTFT is stamped when the first
token is back on the caller's event loop; later tokens when the step loop emits them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from bench.serve_workload import RequestTrace, ServeBenchConfig
from decode_svc.backends import BackendConfig, make_backend
from decode_svc.loop import DecodeLoop
from decode_svc.sequence import Sequence, StreamSink
from serving import metrics
from snapstream.engine import Engine
from snapstream.kvcache import SequenceCache
from snapstream.sampling import sample_batch
from snapstream.sampling_params import SamplingParams


class InProcessServer:
    """Greedy generation under ``cfg.policy``, stopping at ``cfg.max_new_tokens`` or an EOS
    token, like the router's requests. ``close()`` stops both threads."""

    def __init__(self, engine: Engine, cfg: ServeBenchConfig) -> None:
        self.engine, self.policy, self.max_new_tokens = engine, cfg.policy, cfg.max_new_tokens
        self.sampling = SamplingParams(stop_token_ids=tuple(engine.tokenizer.eos_token_ids))
        self.prefill_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefill")
        backend = make_backend(BackendConfig(), engine.config)
        self.loop = DecodeLoop(engine, backend, rows=cfg.rows, max_queue=cfg.max_queue)
        self.loop.start()

    async def generate(self, ids: list[int]) -> RequestTrace:
        aio = asyncio.get_running_loop()
        sent = time.perf_counter()
        first, cache = await aio.run_in_executor(self.prefill_thread, self._prefill, ids, sent)
        arrivals, token_ids = [time.perf_counter()], [first]
        if first in self.sampling.stop_token_ids or self.max_new_tokens == 1:
            return RequestTrace(sent, tuple(arrivals), tuple(token_ids))
        sink = StreamSink.here()
        self.loop.submit(self._sequence(first, cache, sink), cache)
        while True:
            event = await sink.queue.get()
            if event.error is not None:
                raise event.error
            arrivals.append(event.at)
            token_ids.append(event.token_id)
            if event.finish_reason is not None:
                return RequestTrace(sent, tuple(arrivals), tuple(token_ids))

    def close(self) -> None:
        self.loop.stop()
        self.prefill_thread.shutdown(wait=True)

    def _prefill(self, ids: list[int], submitted: float) -> tuple[int, SequenceCache]:
        """As the prefill service's model thread does, less the blob encoding; observed in the
        same histograms, in this process."""
        with metrics.prefill_turn(submitted):
            result = self.engine.prefill(ids, self.policy, self.max_new_tokens,
                                         capacity=self.engine.context_len)
            first = sample_batch(result.logits[None], [self.sampling], [len(ids)])[0]
        return first, result.cache

    def _sequence(self, first: int, cache: SequenceCache, sink: StreamSink) -> Sequence:
        return Sequence(request_id=uuid.uuid4().hex, prompt_len=cache.prompt_len,
                        next_position=cache.next_position, replay=deque([first]),
                        max_new_tokens=self.max_new_tokens, emitted=1, sampling=self.sampling,
                        stop_ids=frozenset(self.sampling.stop_token_ids), sink=sink)
