"""Prefill servicer: a bounded queue in front of one model thread, blob into the KV store."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kvstore import BlobStore, new_blob_key
from kvstore.codec import BlobSpec, encode_blob
from kvstore.stores.base import check_key
from prefill_svc import speculative
from prefill_svc.prefix_store import PrefixStore, PrefixStoreConfig, prefix_key
from serving import metrics
from serving.convert import PREFIX_CACHE_TO_PB, duration, policy_from_pb, sampling_from_pb
from serving.errors import QueueFull, RequestError
from snapstream.engine import Engine
from snapstream.kvcache import SequenceCache
from snapstream.policy import CachePolicy
from snapstream.sampling import sample_batch
from snapstream.sampling_params import SamplingParams
from snapstream.specprefill.selector import DraftSelector
from snapstream.specprefill.settings import SpeculativeSettings
from snapstream.v1 import common_pb2, prefill_pb2, prefill_pb2_grpc


@dataclass(frozen=True)
class PrefillOutput:
    blob: bytearray
    first_token: int
    prefill_s: float
    compress_s: float
    cache_slots: int  # per global layer and KV head (the policy's budget; see kvcache.py)
    speculative: common_pb2.SpeculativeReport | None = None


class PrefillServicer(prefill_pb2_grpc.PrefillServicer):
    def __init__(self, engine: Engine, store: BlobStore, spec: BlobSpec, blob_ttl_s: float,
                 max_queue: int, prefixes: PrefixStore | None = None,
                 selector: DraftSelector | None = None) -> None:
        self.engine, self.store, self.spec = engine, store, spec
        self.prefixes = prefixes or PrefixStore(store, spec, PrefixStoreConfig())
        self.selector = selector  # the draft model, for speculative prefill
        self.speculative_defaults = SpeculativeSettings.defaults_for(engine.config)
        self.blob_ttl_s, self.max_queue = blob_ttl_s, max_queue
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefill-model")
        self.outstanding = 0

    async def Prefill(self, request: prefill_pb2.PrefillRequest, context
                      ) -> prefill_pb2.PrefillResponse:
        if self.outstanding >= self.max_queue + 1:
            raise QueueFull(f"prefill queue is full ({self.max_queue} waiting); retry later")
        ids, policy, sampling = self._resolve(request)
        job = speculative.job_from_request(request, self.selector, self.speculative_defaults)
        key = _blob_key(request.blob_key) if request.blob_key else new_blob_key()
        self.outstanding += 1
        metrics.WAITING.labels("prefill").set(self.outstanding)
        try:
            out, outcome = await self._prefill(ids, policy, sampling, request, job)
            start = time.perf_counter()
            # a caller that leaves (cancel, deadline) during the put leaves nothing behind: the
            # store deletes what a cut-short put wrote
            await self.store.put(key, out.blob, ttl_s=self.blob_ttl_s)
            store_s = time.perf_counter() - start
        finally:
            self.outstanding -= 1
            metrics.WAITING.labels("prefill").set(self.outstanding)
        metrics.BLOB_BYTES.labels("put").observe(len(out.blob))
        metrics.BLOB_TRANSFER.labels("put").observe(store_s)
        return prefill_pb2.PrefillResponse(
            blob_key=key, blob_size=len(out.blob), first_token_id=out.first_token,
            prompt_tokens=len(ids), prefill_time=duration(out.prefill_s),
            compress_time=duration(out.compress_s), store_time=duration(store_s),
            cache_slots=out.cache_slots, prefix_cache=PREFIX_CACHE_TO_PB[outcome],
            speculative=out.speculative)

    async def _prefill(self, ids: list[int], policy: CachePolicy, sampling: SamplingParams,
                       request: prefill_pb2.PrefillRequest,
                       job: speculative.SpeculativeJob | None) -> tuple[PrefillOutput, str]:
        """On the model thread, on top of the request's stored document when it marks one."""
        submitted = time.perf_counter()
        if not request.prefix_tokens:
            return await self._on_model_thread(
                self._run_model, ids, policy, sampling, request.max_new_tokens, submitted,
                None, job), ""
        doc_ids, document = ids[: request.prefix_tokens], self.prefixes.config.document
        prefix, outcome = await self.prefixes.get_or_compress(
            prefix_key(self.spec, policy, doc_ids, document), len(doc_ids),
            lambda: self._on_model_thread(self.engine.compress_prefix, doc_ids, policy,
                                          request.max_new_tokens, self.engine.context_len,
                                          document))
        out = await self._on_model_thread(self._run_model, ids, policy, sampling,
                                          request.max_new_tokens, submitted, prefix, None)
        return out, outcome

    async def _on_model_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _resolve(self, request: prefill_pb2.PrefillRequest
                 ) -> tuple[list[int], CachePolicy, SamplingParams]:
        """The request as domain types. Its fields were validated by the router; what the
        model needs to run safely, the engine checks when it prefills."""
        if request.prefix_tokens and request.HasField("speculative"):
            raise RequestError("prefix_tokens and speculative cannot be combined: a reusable "
                               "document is prefilled whole; send one of them",
                               field="speculative")
        if request.prefix_tokens and request.prefix_tokens >= len(request.prompt_token_ids):
            raise RequestError(f"prefix_tokens ({request.prefix_tokens}) must be less than the "
                               f"prompt's {len(request.prompt_token_ids)} tokens",
                               field="prefix_tokens")
        return (list(request.prompt_token_ids),
                policy_from_pb(request.policy, self.engine.default_policy),
                sampling_from_pb(request.sampling, SamplingParams()))

    async def Release(self, request: prefill_pb2.ReleaseRequest, context
                      ) -> prefill_pb2.ReleaseResponse:
        await self.store.delete(_blob_key(request.blob_key))
        return prefill_pb2.ReleaseResponse()

    def _run_model(self, ids: list[int], policy: CachePolicy, sampling: SamplingParams,
                   max_new_tokens: int, submitted: float, prefix: SequenceCache | None,
                   job: speculative.SpeculativeJob | None) -> PrefillOutput:
        """On the model thread: the draft's selection (speculative requests), prefill (of what
        follows ``prefix``, a stored document, when given), SnapKV, blob encoding and the first
        token."""
        with metrics.prefill_turn(submitted):
            capacity = self.engine.context_len
            selection = job and speculative.select(self.selector, job, self.engine.tokenizer,
                                                   ids, capacity)
            kept, positions = (selection.ids, selection.positions) if selection else (ids, None)
            result = (self.engine.prefill(kept, policy, max_new_tokens, capacity=capacity,
                                          positions=positions)
                      if prefix is None else
                      self.engine.prefill_on_prefix(prefix, ids, policy, max_new_tokens,
                                                    capacity, self.prefixes.config.document))
            start = time.perf_counter()
            blob = encode_blob(result.cache, self.spec)
            encode_s = time.perf_counter() - start
            first = sample_batch(result.logits[None], [sampling],
                                 [result.cache.next_position])[0]
        forward_s = result.prefill_s - result.select_s
        return PrefillOutput(blob, first, forward_s, result.select_s + encode_s,
                             result.cache.layout.global_slots,
                             selection and speculative.report(selection, forward_s))

    def close(self) -> None:
        self.executor.shutdown(wait=True)


def _blob_key(key: str) -> str:
    try:
        return check_key(key)
    except ValueError as exc:
        raise RequestError(f"blob_key: {exc}", field="blob_key") from None
