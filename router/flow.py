"""The router's one generation path, shared by the gRPC and the OpenAI HTTP APIs:
resolve -> prefill -> decode stream (with failover) -> text chunks, then a Finished.

The request arrives as the native ``GenerateRequest`` (the HTTP API converts its bodies into
one), so both APIs share one validator; what comes out are domain events, which each API
frames its own way. Cancelling the consumer (a gRPC cancel, an HTTP client that leaves)
cancels the prefill or decode call in flight, and the blob is released.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

import grpc

from kvstore import new_blob_key
from router.failover import BlobRejected, DecodeAttempts
from router.request import ResolvedRequest, ServedModel, resolve
from router.tenants import Admission, TenantLimits, TenantLoad
from router.text import TextStream
from router.workers import Worker, WorkerPool
from serving import metrics
from serving.convert import FINISH_FROM_PB, PREFIX_CACHE_FROM_PB, policy_to_pb, sampling_to_pb
from serving.errors import QueueFull, Unavailable, status_for
from snapstream.finish import finish_reason
from snapstream.v1 import common_pb2, decode_pb2, generation_pb2, prefill_pb2

log = logging.getLogger(__name__)
RELEASE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class TextChunk:
    """Tokens generated since the previous chunk and their text (never half a character)."""

    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class Finished:
    """The last event of a generation."""

    finish_reason: str  # length, stop_token, stop_string, context_length
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_s: float  # request received to first token sent
    decode_time_s: float  # first token to last token
    simulated_decode_time_s: float  # on the sn40l-sim back end's accelerator, else 0
    kv_cache_bytes: int
    kv_cache_slots: int
    prefix_cache: str = ""  # stored, hit or bypass when the request marked a document
    prefix_cache_reason: str = ""  # why a bypass: over_cap, store_full, store_unavailable
    speculative: common_pb2.SpeculativeReport | None = None  # when the request asked for it


Event = TextChunk | Finished


@dataclass
class Progress:
    """What the client already has: resuming elsewhere replays exactly these tokens."""

    tokens: list[int] = field(default_factory=list)
    complete: decode_pb2.DecodeComplete | None = None
    blob_key: str = ""  # the request's blob (another after a prefill again)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class RequestFlow:
    """``generate`` is the one way the router serves a request; ``active`` counts the
    generations in flight (draining waits for it)."""

    def __init__(self, model: ServedModel, prefill: WorkerPool, decode: WorkerPool,
                 tenant_limits: TenantLimits | None = None) -> None:
        self.model, self.prefill, self.decode = model, prefill, decode
        self.tenants = TenantLoad(tenant_limits or TenantLimits())
        self.active = 0
        self.releasing: set[asyncio.Task] = set()

    async def generate(self, request: generation_pb2.GenerateRequest, *, api: str,
                       request_id: str, tenant: str, deadline: float | None = None
                       ) -> AsyncIterator[Event]:
        """Raises RequestError (before any event) for a request that does not resolve and
        OverQuota for one over its tenant's quotas; ``deadline`` is a ``time.monotonic()`` time,
        None for none."""
        received = time.monotonic()
        try:
            req = resolve(request, self.model, request_id, tenant)
            admission = self.tenants.admit(tenant, len(req.prompt_ids))
        except Exception as exc:
            outcome = _outcome(exc, deadline)
            metrics.REQUESTS.labels("router", api, outcome).inc()
            metrics.TENANT_REQUESTS.labels(tenant, outcome).inc()
            raise
        self.active += 1
        metrics.RUNNING.labels("router").inc()
        outcome = "cancelled"
        try:
            async for event in self._generate(req, admission, received, deadline):
                if isinstance(event, Finished):  # the last event: the caller may stop here
                    outcome = "ok"
                yield event
        except BaseException as exc:
            if outcome != "ok":  # not a consumer that stops once it has the Finished
                outcome = _outcome(exc, deadline)
            raise
        finally:
            self.active -= 1
            self.tenants.release(admission)
            metrics.RUNNING.labels("router").dec()
            metrics.REQUESTS.labels("router", api, outcome).inc()
            metrics.TENANT_REQUESTS.labels(tenant, outcome).inc()
            metrics.END_TO_END.labels("router").observe(time.monotonic() - received)

    async def _generate(self, req: ResolvedRequest, admission: Admission, received: float,
                        deadline: float | None) -> AsyncIterator[Event]:
        prefilled = await self._prefill_once(req, deadline)
        self.tenants.prefilled(admission)
        progress = Progress(tokens=[prefilled.first_token_id], blob_key=prefilled.blob_key)
        try:
            text = TextStream(self.model.tokenizer, req.stop)
            first_sent = last_sent = time.monotonic()
            metrics.TIME_TO_FIRST_TOKEN.observe(first_sent - received)
            yield TextChunk((prefilled.first_token_id,), text.push([prefilled.first_token_id]))
            sent = 1
            finish = _finish_after_prefill(req, prefilled.first_token_id, text)
            if finish is None:
                async for tokens in self._decode(req, prefilled, progress, deadline):
                    now = time.monotonic()
                    metrics.INTER_TOKEN_LATENCY.observe(now - last_sent)
                    last_sent = now
                    chunk = until_stop(tokens, text)
                    sent += len(chunk.token_ids)
                    yield chunk
                    if text.stopped:
                        finish = "stop_string"
                        break
                finish = finish or FINISH_FROM_PB[progress.complete.finish_reason]
            tail = text.finish()
            if tail:
                yield TextChunk((), tail)
            simulated = (progress.complete.simulated_decode_time.ToNanoseconds() / 1e9
                         if progress.complete else 0.0)
            yield Finished(
                finish_reason=finish, prompt_tokens=len(req.prompt_ids), completion_tokens=sent,
                time_to_first_token_s=first_sent - received, decode_time_s=last_sent - first_sent,
                simulated_decode_time_s=simulated, kv_cache_bytes=prefilled.blob_size,
                kv_cache_slots=prefilled.cache_slots,
                prefix_cache=PREFIX_CACHE_FROM_PB[prefilled.prefix_cache],
                prefix_cache_reason=prefilled.prefix_cache_reason,
                speculative=prefilled.speculative if prefilled.HasField("speculative") else None)
        finally:
            if progress.complete is None:  # no decode stream consumed the blob to its end
                self._release_soon(progress.blob_key)

    async def _prefill_once(self, req: ResolvedRequest, deadline: float | None
                            ) -> prefill_pb2.PrefillResponse:
        """The request prefilled into a blob of a key picked here, so that a prefill cut short
        can be released."""
        blob_key = new_blob_key()
        try:
            return await self._prefill(req, blob_key, _remaining(deadline))
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            # the prefill worker may have stored the blob before the cancel, deadline or
            # broken call reached it
            self._release_soon(blob_key)
            raise

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

    async def _prefill(self, req: ResolvedRequest, blob_key: str, timeout: float | None
                       ) -> prefill_pb2.PrefillResponse:
        """On the least busy prefill worker; a full or unreachable one passes the request on.
        QueueFull when every worker was full, Unavailable (naming the last worker's reason,
        e.g. its store) when none could serve it."""
        message = prefill_pb2.PrefillRequest(
            request_id=req.request_id, prompt_token_ids=list(req.prompt_ids),
            policy=policy_to_pb(req.policy), sampling=sampling_to_pb(req.sampling),
            max_new_tokens=req.max_new_tokens, blob_key=blob_key,
            prefix_tokens=req.prefix_tokens, tenant=req.tenant, cache_salt=req.cache_salt,
            speculative=req.speculative, speculative_prompt=req.speculative_prompt)
        tried: set[str] = set()
        full: set[str] = set()
        reasons: list[str] = []  # why each unreachable worker was
        refusals: list[str] = []  # what each full one said
        while True:
            try:
                worker = self.prefill.pick(exclude=tried)
            except Unavailable as exc:
                if full and full == tried:
                    raise QueueFull(f"every prefill worker's queue is full ({len(full)} "
                                    f"tried; the last said: {refusals[-1]}); retry "
                                    "later") from None
                raise (Unavailable(f"no prefill worker could serve the request; "
                                   f"{reasons[-1]}") if reasons else exc) from None
            with self.prefill.track(worker):
                try:
                    return await worker.stub.Prefill(message, timeout=timeout)
                except grpc.aio.AioRpcError as err:
                    if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # its queue or its
                        full.add(worker.address)  # store is full
                        refusals.append(err.details())
                    elif err.code() == grpc.StatusCode.UNAVAILABLE:
                        worker.mark_failed()
                        reasons.append(f"{worker.address}: {err.details()}")
                    else:
                        raise
                    tried.add(worker.address)

    async def _decode(self, req: ResolvedRequest, prefilled, progress: Progress,
                      deadline: float | None) -> AsyncIterator[list[int]]:
        """Yields the new tokens of each chunk; resumes on another worker when a stream breaks
        (:class:`router.failover.DecodeAttempts`). When no worker can be picked (all full, dead
        or in their failure backoff, as right after a kill), it waits and tries again, up to
        ~30 s within the deadline: the blob is made, and a restarted worker takes the stream.
        A blob the decode worker rejects (its MAC or checks failed; it deleted it) is made again
        once, by a prefill of the same request (the same first token: prefill is deterministic
        and a sampled request's seed is fixed)."""
        attempts = DecodeAttempts(req.request_id)
        while progress.complete is None:
            try:
                worker = self.decode.pick(exclude=attempts.tried)
            except Unavailable:
                await attempts.wait(deadline)
                continue
            try:
                stream = self._stream(worker, req, progress.blob_key, progress, deadline)
                async with aclosing(stream) as chunks:
                    async for tokens in chunks:
                        yield tokens
            except grpc.aio.AioRpcError as err:
                try:
                    attempts.broke(worker, err, len(progress.tokens))
                except BlobRejected:
                    if attempts.prefilled_again:
                        raise
                    attempts.prefilled_again = True
                    progress.blob_key = (await self._prefill_once(req, deadline)).blob_key

    async def _stream(self, worker: Worker, req: ResolvedRequest, blob_key: str,
                      progress: Progress, deadline: float | None) -> AsyncIterator[list[int]]:
        """One Decode call on ``worker``, from the tokens the client has (``progress``, which
        records each chunk and the complete message): yields each chunk's tokens; AioRpcError
        when the stream breaks, or ends without its complete message."""
        call = worker.stub.Decode(decode_pb2.DecodeRequest(
            request_id=req.request_id, blob_key=blob_key,
            first_token_id=progress.tokens[0], generated_token_ids=progress.tokens[1:],
            sampling=sampling_to_pb(req.sampling), max_new_tokens=req.max_new_tokens),
            timeout=_remaining(deadline))
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
            finally:
                call.cancel()


def _outcome(exc: BaseException, deadline: float | None) -> str:
    """The ``outcome`` label of a generation that ended with ``exc``: the status code's name
    (``invalid_argument``, ``unavailable``, ...), ``cancelled`` when the client left, and
    ``deadline_exceeded`` when its deadline passed."""
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        past_deadline = deadline is not None and time.monotonic() >= deadline
        return "deadline_exceeded" if past_deadline else "cancelled"
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else status_for(exc)
    return (code or grpc.StatusCode.INTERNAL).name.lower()


def _broken(address: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), f"decode stream from {address} ended early")


def until_stop(tokens: list[int], text: TextStream) -> TextChunk:
    """The tokens up to and including the one that completes a stop string (all if none does),
    and their text."""
    deltas = []
    for i, token in enumerate(tokens):
        deltas.append(text.push([token]))
        if text.stopped:
            return TextChunk(tuple(tokens[: i + 1]), "".join(deltas))
    return TextChunk(tuple(tokens), "".join(deltas))


def _finish_after_prefill(req: ResolvedRequest, first: int, text: TextStream) -> str | None:
    if text.stopped:
        return "stop_string"
    return finish_reason(first, 1, req.sampling.stop_token_ids, req.max_new_tokens)
