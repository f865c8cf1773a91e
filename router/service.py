"""The gRPC Generation servicer: GenerateRequest in, the shared generation's events out as
GenerateResponse messages."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from router.flow import Event, Finished, RequestFlow
from serving.auth import DEFAULT_TENANT, ApiKeys
from serving.convert import FINISH_TO_PB, PREFIX_CACHE_TO_PB, duration, policy_to_pb
from serving.errors import current_request_id
from snapstream.v1 import generation_pb2, generation_pb2_grpc


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    """``api_keys``: the router's (their interceptor already refused a call without one); a
    call's key names its tenant. None: every call is the one default tenant."""

    def __init__(self, generation: RequestFlow, api_keys: ApiKeys | None = None) -> None:
        self.generation, self.api_keys = generation, api_keys

    async def Info(self, request, context) -> generation_pb2.InfoResponse:
        model = self.generation.model
        return generation_pb2.InfoResponse(
            model_name=model.name, model_fingerprint=self.generation.decode.model_fingerprint(),
            context_length=model.context_len, vocab_size=model.config.vocab_size,
            eos_token_ids=list(model.tokenizer.eos_token_ids),
            default_policy=policy_to_pb(model.default_policy),
            has_chat_template=model.tokenizer.chat_template is not None)

    async def Generate(self, request, context) -> AsyncIterator[generation_pb2.GenerateResponse]:
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        events = self.generation.generate(request, api="grpc", request_id=current_request_id(),
                                          tenant=self._tenant(context), deadline=deadline)
        async with aclosing(events):
            async for event in events:
                yield event_to_pb(event)


    def _tenant(self, context) -> str:
        if self.api_keys is None:
            return DEFAULT_TENANT
        metadata = dict(context.invocation_metadata() or ())
        return self.api_keys.tenant_of(metadata.get("authorization")) or DEFAULT_TENANT


def event_to_pb(event: Event) -> generation_pb2.GenerateResponse:
    if not isinstance(event, Finished):
        return generation_pb2.GenerateResponse(chunk=generation_pb2.GenerateChunk(
            token_ids=event.token_ids, text=event.text))
    return generation_pb2.GenerateResponse(complete=generation_pb2.GenerateComplete(
        finish_reason=FINISH_TO_PB[event.finish_reason], prompt_tokens=event.prompt_tokens,
        completion_tokens=event.completion_tokens,
        time_to_first_token=duration(event.time_to_first_token_s),
        decode_time=duration(event.decode_time_s),
        simulated_decode_time=duration(event.simulated_decode_time_s),
        kv_cache_bytes=event.kv_cache_bytes, kv_cache_slots=event.kv_cache_slots,
        prefix_cache=PREFIX_CACHE_TO_PB[event.prefix_cache],
        prefix_cache_reason=event.prefix_cache_reason,
        speculative=event.speculative))
