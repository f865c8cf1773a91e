"""gRPC face of the decode worker: fetch + validate the blob, hand it to the loop, stream."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from decode_svc.loop import DecodeLoop
from decode_svc.sequence import DecodeEvent, Sequence, StreamSink
from kvstore import BlobStore
from kvstore.blob_errors import BlobError
from kvstore.codec import BlobSpec, decode_blob
from kvstore.seal import ClusterSecret, Seal
from kvstore.stores.base import check_key
from serving import metrics
from serving.convert import FINISH_TO_PB, duration, sampling_from_pb
from serving.errors import RequestError, Unavailable
from snapstream.kvcache import SequenceCache
from snapstream.sampling_params import SamplingParams
from snapstream.v1 import decode_pb2, decode_pb2_grpc


class DecodeServicer(decode_pb2_grpc.DecodeServicer):
    def __init__(self, loop: DecodeLoop, store: BlobStore, spec: BlobSpec,
                 secret: ClusterSecret) -> None:
        self.loop, self.store, self.spec, self.secret = loop, store, spec, secret
        self.draining = False  # set on SIGTERM: no new streams; cut-off blobs are kept

    def start_draining(self) -> None:
        self.draining = True

    async def Stats(self, request, context) -> decode_pb2.StatsResponse:
        stats = self.loop.stats()
        free = 0 if self.draining else stats.free_rows
        return decode_pb2.StatsResponse(total_rows=stats.total_rows,
                                        free_rows=free, running=stats.running,
                                        queue_depth=stats.queue_depth,
                                        model_fingerprint=self.spec.fingerprint.hex())

    async def Decode(self, request: decode_pb2.DecodeRequest, context):
        received = time.monotonic()
        if self.draining:
            raise Unavailable("this decode worker is shutting down; use another one")
        _validate(request, self.loop.engine.config.vocab_size)
        sampling = sampling_from_pb(request.sampling, SamplingParams())
        try:
            start = time.perf_counter()
            data = await self.store.get(request.blob_key)
            metrics.BLOB_TRANSFER.labels("get").observe(time.perf_counter() - start)
            metrics.BLOB_BYTES.labels("get").observe(len(data))
            # its MAC for this key, then every field: a forged or altered blob is never used
            cache = await asyncio.to_thread(decode_blob, data, self.spec,
                                            Seal(self.secret, request.blob_key, None))
            loaded_at = time.monotonic()
        except BlobError:
            self.store.delete_soon(request.blob_key)  # unusable anywhere: do not leave it behind
            raise
        sink = StreamSink.here()
        seq = _sequence(request, sampling, cache, sink)
        reason, last = seq.finish_reason(seq.replay[-1]), DecodeEvent()
        if reason is None:
            # a worker that refuses the sequence (queue full) leaves its blob to the next one
            self.loop.submit(seq, cache)
        try:
            while reason is None:
                # one chunk carries every token produced since the last one was sent: one
                # token per step while this stream keeps up, more when it falls behind
                events = [await sink.queue.get(), *sink.drain()]
                tokens = [event.token_id for event in events if event.error is None]
                if tokens:
                    yield decode_pb2.DecodeResponse(
                        chunk=decode_pb2.DecodeChunk(token_ids=tokens))
                last = events[-1]
                if last.error is not None:
                    raise last.error
                reason = last.finish_reason
            yield decode_pb2.DecodeResponse(complete=decode_pb2.DecodeComplete(
                finish_reason=FINISH_TO_PB[reason], prompt_tokens=cache.prompt_len,
                completion_tokens=seq.emitted, queue_time=duration(last.queue_s),
                load_time=duration(loaded_at - received), decode_time=duration(last.decode_s),
                simulated_decode_time=duration(last.simulated_s)))
        finally:
            if reason is None:  # cancelled, deadline, or the stream broke
                self.loop.cancel(seq.request_id)
            if reason is not None or not self.draining:
                # a stream cut off by this worker's shutdown keeps its blob: the router resumes
                # it elsewhere (the TTL removes it if nobody does)
                self.store.delete_soon(request.blob_key)


def _sequence(request: decode_pb2.DecodeRequest, sampling: SamplingParams,
              cache: SequenceCache, sink: StreamSink) -> Sequence:
    known = [request.first_token_id, *request.generated_token_ids]
    return Sequence(
        request_id=request.request_id, prompt_len=cache.prompt_len,
        next_position=cache.next_position, replay=deque(known),
        max_new_tokens=request.max_new_tokens, emitted=len(known), sampling=sampling,
        stop_ids=frozenset(sampling.stop_token_ids), sink=sink)


def _validate(request: decode_pb2.DecodeRequest, vocab_size: int) -> None:
    try:
        check_key(request.blob_key)
    except ValueError as exc:
        raise RequestError(f"blob_key: {exc}", field="blob_key") from None
    known = 1 + len(request.generated_token_ids)  # the first token and those already streamed
    if known > request.max_new_tokens:
        raise RequestError(f"max_new_tokens={request.max_new_tokens} is less than the {known} "
                           "tokens the request already has (first_token_id, "
                           "generated_token_ids)", field="max_new_tokens")
    token_fields = {"first_token_id": (request.first_token_id,),
                    "generated_token_ids": request.generated_token_ids,
                    "sampling.stop_token_ids": request.sampling.stop_token_ids}
    for field, ids in token_fields.items():
        bad = [i for i in ids if i >= vocab_size]
        if bad:
            raise RequestError(f"{field} {bad[:5]} are outside the vocabulary "
                               f"[0, {vocab_size})", field=field)
