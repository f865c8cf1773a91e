"""Prefill servicer: a bounded queue in front of one model thread, blob into the KV store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kvstore import BlobStore, new_blob_key
from kvstore.codec import BlobSpec, encode_blob
from kvstore.seal import ClusterSecret, Seal, tokens_digest
from kvstore.stores.base import check_key
from prefill_svc import speculative
from prefill_svc.prefix_store import (
    Document,
    PrefixOutcome,
    PrefixStore,
    PrefixStoreConfig,
    namespace_of,
    prefix_key,
)
from serving import metrics
from serving.auth import DEFAULT_TENANT
from serving.convert import PREFIX_CACHE_TO_PB, duration, policy_from_pb, sampling_from_pb
from serving.errors import QueueFull, RequestError
from snapstream.cancel import Cancel
from snapstream.engine import Engine
from snapstream.kvcache import SequenceCache
from snapstream.memory_plan import PrefillMemory
from snapstream.policy import CachePolicy
from snapstream.prefix_cache import check_policy, store_layout
from snapstream.sampling import sample_batch
from snapstream.sampling_params import SamplingParams
from snapstream.specprefill.selector import DraftSelector
from snapstream.specprefill.settings import SpeculativeSettings
from snapstream.v1 import common_pb2, prefill_pb2, prefill_pb2_grpc


@dataclass(frozen=True)
class Work:
    """One Prefill call's request as domain types, the seal of its blob, and the flag that
    stops its model work when the call is cancelled."""

    request: prefill_pb2.PrefillRequest
    ids: list[int]
    policy: CachePolicy
    sampling: SamplingParams
    job: speculative.SpeculativeJob | None
    seal: Seal
    cancel: Cancel = field(default_factory=Cancel)


@dataclass(frozen=True)
class PrefillOutput:
    blob: bytearray
    first_token: int
    prefill_s: float
    compress_s: float
    cache_slots: int  # per global layer and KV head (the policy's budget; see kvcache.py)
    speculative: common_pb2.SpeculativeReport | None = None


class PrefillServicer(prefill_pb2_grpc.PrefillServicer):
    def __init__(self, engine: Engine, store: BlobStore, spec: BlobSpec, secret: ClusterSecret,
                 blob_ttl_s: float, max_queue: int, prefixes: PrefixStore | None = None,
                 selector: DraftSelector | None = None) -> None:
        self.engine, self.store, self.spec, self.secret = engine, store, spec, secret
        self.prefixes = prefixes or PrefixStore(store, spec, secret, PrefixStoreConfig())
        self.selector = selector  # the draft model, for speculative prefill
        self.speculative_defaults = SpeculativeSettings.defaults_for(engine.config)
        self.blob_ttl_s, self.max_queue = blob_ttl_s, max_queue
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefill-model")
        self.outstanding = 0
        # the worker's memory once warm (prefill_svc.main sets it): prompts whose activations
        # would not fit are refused before they queue; None admits every prompt
        self.memory: PrefillMemory | None = None

    async def Prefill(self, request: prefill_pb2.PrefillRequest, context
                      ) -> prefill_pb2.PrefillResponse:
        if self.outstanding >= self.max_queue + 1:
            raise QueueFull(f"prefill queue is full ({self.max_queue} waiting); retry later")
        ids, policy, sampling = self._resolve(request)
        if self.memory is not None:
            self.memory.check_prompt(len(ids))  # MemoryExhausted: RESOURCE_EXHAUSTED
        job = speculative.job_from_request(request, self.selector, self.speculative_defaults)
        key = _blob_key(request.blob_key) if request.blob_key else new_blob_key()
        work = Work(request, ids, policy, sampling, job, Seal(self.secret, key, tokens_digest(ids)))
        self.outstanding += 1
        metrics.WAITING.labels("prefill").set(self.outstanding)
        try:
            out, outcome = await self._prefill(work)
            start = time.perf_counter()
            # a caller that leaves (cancel, deadline) during the put leaves nothing behind: the
            # store deletes what a cut-short put wrote
            await self.store.put(key, out.blob, ttl_s=self.blob_ttl_s)
            store_s = time.perf_counter() - start
        except asyncio.CancelledError:
            work.cancel.set()  # the model thread stops at its next layer or look-ahead step
            raise
        finally:
            self.outstanding -= 1
            metrics.WAITING.labels("prefill").set(self.outstanding)
        metrics.BLOB_BYTES.labels("put").observe(len(out.blob))
        metrics.BLOB_TRANSFER.labels("put").observe(store_s)
        return prefill_pb2.PrefillResponse(
            blob_key=key, blob_size=len(out.blob), first_token_id=out.first_token,
            prompt_tokens=len(ids), prefill_time=duration(out.prefill_s),
            compress_time=duration(out.compress_s), store_time=duration(store_s),
            cache_slots=out.cache_slots, prefix_cache=PREFIX_CACHE_TO_PB[outcome.state],
            prefix_cache_reason=outcome.reason, speculative=out.speculative)

    async def _prefill(self, work: Work) -> tuple[PrefillOutput, PrefixOutcome]:
        """On the model thread, on top of the request's stored document when it marks one."""
        submitted = time.perf_counter()
        request = work.request
        if not request.prefix_tokens:
            return await self._on_model_thread(self._run_model, work, submitted, None), \
                PrefixOutcome("")
        doc_ids, document = work.ids[: request.prefix_tokens], self.prefixes.config.document
        tenant = request.tenant or DEFAULT_TENANT
        doc = Document(prefix_key(self.spec, work.policy, doc_ids, document,
                                  namespace_of(tenant, request.cache_salt)),
                       tenant, tuple(doc_ids))
        prefix, outcome = await self.prefixes.get_or_compress(
            doc, lambda: self._on_model_thread(self.engine.compress_prefix, doc_ids,
                                               work.policy, request.max_new_tokens,
                                               self.engine.context_len, document, work.cancel),
            self._stored_layout_check(work))
        out = await self._on_model_thread(self._run_model, work, submitted, prefix)
        return out, outcome

    def _stored_layout_check(self, work: Work) -> Callable[[SequenceCache], str | None]:
        """Whether a stored document's cache has the layout this request's policy reads."""
        layout = work.policy.layout(len(work.ids), work.request.max_new_tokens,
                                    self.engine.context_len)
        document = self.prefixes.config.document

        def check(cache: SequenceCache) -> str | None:
            stored = cache.groups[0].group.layout
            expected = store_layout(layout, document, cache.prompt_len)
            return None if stored == expected else (
                f"its layout {stored} is not the {expected} this request's policy reads")

        return check

    async def _on_model_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _resolve(self, request: prefill_pb2.PrefillRequest
                 ) -> tuple[list[int], CachePolicy, SamplingParams]:
        """The request as domain types, checked as far as the model needs to run it safely
        (the router validated the rest): a field that fails is a RequestError."""
        if request.prefix_tokens and request.HasField("speculative"):
            raise RequestError("prefix_tokens and speculative cannot be combined: a reusable "
                               "document is prefilled whole; send one of them",
                               field="speculative")
        if request.prefix_tokens and request.prefix_tokens >= len(request.prompt_token_ids):
            raise RequestError(f"prefix_tokens ({request.prefix_tokens}) must be less than the "
                               f"prompt's {len(request.prompt_token_ids)} tokens",
                               field="prefix_tokens")
        ids = list(request.prompt_token_ids)
        policy = policy_from_pb(request.policy, self.engine.default_policy)
        try:  # a speculative prompt may be longer than the context (compact positions): what
            # the draft keeps is checked against it
            self.engine.check_prompt(ids)
        except ValueError as exc:
            if not (request.HasField("speculative") and len(ids) > self.engine.context_len):
                raise RequestError(f"prompt_token_ids: {exc}", field="prompt_token_ids") from None
        try:
            policy.check_context(self.engine.context_len)
            if request.prefix_tokens:
                check_policy(policy)
        except ValueError as exc:
            raise RequestError(f"policy: {exc}", field="policy") from None
        return ids, policy, sampling_from_pb(request.sampling, SamplingParams())

    async def Release(self, request: prefill_pb2.ReleaseRequest, context
                      ) -> prefill_pb2.ReleaseResponse:
        await self.store.delete(_blob_key(request.blob_key))
        return prefill_pb2.ReleaseResponse()

    def _run_model(self, work: Work, submitted: float, prefix: SequenceCache | None
                   ) -> PrefillOutput:
        """On the model thread: the draft's selection (speculative requests), prefill (of what
        follows ``prefix``, a stored document, when given), SnapKV, blob encoding and the first
        token. Stops with Cancelled once the request is cancelled."""
        work.cancel.check()  # cancelled while it waited for the model thread
        ids, policy = work.ids, work.policy
        max_new_tokens = work.request.max_new_tokens
        with metrics.prefill_turn(submitted):
            capacity = self.engine.context_len
            selection = work.job and speculative.select(self.selector, work.job,
                                                        self.engine.tokenizer, ids, capacity,
                                                        work.cancel)
            kept, positions = (selection.ids, selection.positions) if selection else (ids, None)
            result = (self.engine.prefill(kept, policy, max_new_tokens, capacity=capacity,
                                          positions=positions, cancel=work.cancel)
                      if prefix is None else
                      self.engine.prefill_on_prefix(prefix, ids, policy, max_new_tokens,
                                                    capacity, self.prefixes.config.document))
            start = time.perf_counter()
            blob = encode_blob(result.cache, self.spec, work.seal)
            encode_s = time.perf_counter() - start
            first = sample_batch(result.logits[None], [work.sampling],
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
