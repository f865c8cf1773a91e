"""Generation servicer: resolve -> prefill -> decode stream (with failover) -> text chunks."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from router.request import ResolvedRequest, ServedModel, resolve
from router.text import TextStream
from router.workers import WorkerPool
from snapstream.serving import metrics
from snapstream.serving.convert import (
    FINISH_FROM_PB,
    FINISH_TO_PB,
    duration,
    policy_to_pb,
    sampling_to_pb,
)
from snapstream.serving.errors import Unavailable
from snapstream.v1 import decode_pb2, generation_pb2, generation_pb2_grpc, prefill_pb2

log = logging.getLogger(__name__)
# a decode stream that ends with one of these is resumed on another decode worker
FAILOVER_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN,
                  grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED,
                  grpc.StatusCode.RESOURCE_EXHAUSTED}
RELEASE_TIMEOUT_S = 5.0


@dataclass
class Progress:
    """What the client already has: resuming elsewhere replays exactly these tokens."""

    tokens: list[int] = field(default_factory=list)
    complete: decode_pb2.DecodeComplete | None = None


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, model: ServedModel, prefill: WorkerPool, decode: WorkerPool) -> None:
        self.model, self.prefill, self.decode = model, prefill, decode
        self.active = 0  # streams in flight, for draining
        self.releasing: set[asyncio.Task] = set()

    async def Info(self, request, context) -> generation_pb2.InfoResponse:
        return generation_pb2.InfoResponse(
            model_name=self.model.name, model_fingerprint=self.decode.model_fingerprint(),
            context_length=self.model.context_len,
            vocab_size=self.model.config.vocab_size,
            eos_token_ids=list(self.model.tokenizer.eos_token_ids),
            default_policy=policy_to_pb(self.model.default_policy),
            has_chat_template=self.model.tokenizer.chat_template is not None)

    async def Generate(self, request, context) -> AsyncIterator[generation_pb2.GenerateResponse]:
        received = time.monotonic()
        req = resolve(request, self.model)
        self.active += 1
        metrics.RUNNING.labels("router").inc()
        outcome = "error"
        try:
            async for response in self._generate(req, context, received):
                yield response
            outcome = "ok"
        finally:
            self.active -= 1
            metrics.RUNNING.labels("router").dec()
            metrics.REQUESTS.labels("router", outcome).inc()
            metrics.END_TO_END.labels("router").observe(time.monotonic() - received)

    async def _generate(self, req: ResolvedRequest, context, received: float):
        prefilled = await self._prefill(req, context.time_remaining())
        progress = Progress(tokens=[prefilled.first_token_id])
        try:
            text = TextStream(self.model.tokenizer, req.stop)
            first_sent = last_sent = time.monotonic()
            metrics.TIME_TO_FIRST_TOKEN.observe(first_sent - received)
            yield _chunk([prefilled.first_token_id], text.push([prefilled.first_token_id]))
            sent = 1
            finish = _finish_after_prefill(req, prefilled.first_token_id, text)
            if finish is None:
                async for tokens in self._decode(req, prefilled, progress, context):
                    now = time.monotonic()
                    metrics.INTER_TOKEN_LATENCY.observe(now - last_sent)
                    last_sent = now
                    kept, delta = _until_stop(tokens, text)
                    sent += len(kept)
                    yield _chunk(kept, delta)
                    if text.stopped:
                        finish = "stop_string"
                        break
                finish = finish or _decode_finish(progress)
            tail = text.finish()
            if tail:
                yield _chunk([], tail)
            simulated = progress.complete.simulated_decode_time if progress.complete else None
            yield generation_pb2.GenerateResponse(complete=generation_pb2.GenerateComplete(
                finish_reason=FINISH_TO_PB[finish], prompt_tokens=len(req.prompt_ids),
                completion_tokens=sent,
                time_to_first_token=duration(first_sent - received),
                decode_time=duration(last_sent - first_sent), simulated_decode_time=simulated,
                kv_cache_bytes=prefilled.blob_size, kv_cache_slots=req.cache_slots))
        finally:
            if progress.complete is None:  # no decode stream consumed the blob to its end
                self._release_soon(prefilled.blob_key)

    def _release_soon(self, blob_key: str) -> None:
        """Deletes a blob through a prefill worker (the router has no store client), in a task
        of its own, so that a cancelled request still does it."""
        task = asyncio.ensure_future(self._release(blob_key))
        self.releasing.add(task)
        task.add_done_callback(self.releasing.discard)

    async def _release(self, blob_key: str) -> None:
        try:
            worker = self.prefill.pick()
            await worker.stub.Release(prefill_pb2.ReleaseRequest(blob_key=blob_key),
                                      timeout=RELEASE_TIMEOUT_S)
        except (Unavailable, grpc.aio.AioRpcError) as err:
            log.warning("could not release blob %s (its TTL will remove it): %s", blob_key, err)

    async def _prefill(self, req: ResolvedRequest, timeout: float | None
                       ) -> prefill_pb2.PrefillResponse:
        message = prefill_pb2.PrefillRequest(
            request_id=req.request_id, prompt_token_ids=list(req.prompt_ids),
            policy=policy_to_pb(req.policy), sampling=sampling_to_pb(req.sampling),
            max_new_tokens=req.max_new_tokens)
        tried: set[str] = set()
        while True:
            worker = self.prefill.pick(exclude=tried)
            with self.prefill.track(worker):
                try:
                    return await worker.stub.Prefill(message, timeout=timeout)
                except grpc.aio.AioRpcError as err:
                    if err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                          grpc.StatusCode.RESOURCE_EXHAUSTED):
                        raise
                    if err.code() == grpc.StatusCode.UNAVAILABLE:
                        worker.mark_failed()
                    tried.add(worker.address)

    async def _decode(self, req: ResolvedRequest, prefilled, progress: Progress, context):
        """Yields the new tokens of each chunk; resumes on another worker when a stream breaks."""
        tried: set[str] = set()
        while progress.complete is None:
            worker = self.decode.pick(exclude=tried)
            call = worker.stub.Decode(decode_pb2.DecodeRequest(
                request_id=req.request_id, blob_key=prefilled.blob_key,
                first_token_id=progress.tokens[0], generated_token_ids=progress.tokens[1:],
                sampling=sampling_to_pb(req.sampling), max_new_tokens=req.max_new_tokens),
                timeout=context.time_remaining())
            with self.decode.track(worker):
                try:
                    async for message in call:
                        if message.HasField("complete"):
                            progress.complete = message.complete
                        elif message.chunk.token_ids:
                            tokens = list(message.chunk.token_ids)
                            progress.tokens += tokens
                            yield tokens
                    if progress.complete is None:
                        raise _broken(worker.address)
                except grpc.aio.AioRpcError as err:
                    if err.code() not in FAILOVER_CODES or context.cancelled():
                        raise
                    log.warning("decode worker %s failed (%s); resuming %s after %d tokens",
                                worker.address, err.code().name, req.request_id,
                                len(progress.tokens))
                    metrics.FAILOVERS.inc()
                    worker.mark_failed()
                    tried.add(worker.address)
                finally:
                    call.cancel()


def _broken(address: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), f"decode stream from {address} ended early")


def _chunk(token_ids: list[int], text: str) -> generation_pb2.GenerateResponse:
    return generation_pb2.GenerateResponse(
        chunk=generation_pb2.GenerateChunk(token_ids=token_ids, text=text))


def _until_stop(tokens: list[int], text: TextStream) -> tuple[list[int], str]:
    """The tokens up to and including the one that completes a stop string (all if none does),
    and their text."""
    deltas = []
    for i, token in enumerate(tokens):
        deltas.append(text.push([token]))
        if text.stopped:
            return tokens[: i + 1], "".join(deltas)
    return tokens, "".join(deltas)


def _finish_after_prefill(req: ResolvedRequest, first: int, text: TextStream) -> str | None:
    if text.stopped:
        return "stop_string"
    if first in req.sampling.stop_token_ids:
        return "stop_token"
    return "length" if req.max_new_tokens == 1 else None


def _decode_finish(progress: Progress) -> str:
    return FINISH_FROM_PB[progress.complete.finish_reason]
