"""Someone with the store's password but not the cluster secret: what they put under a
document's key or under a request's blob is detected by its MAC, deleted and never served;
the document is compressed again, and the request prefilled again (then, if the blob is forged
again, refused with a retry hint). On real Redis and NATS servers."""

from __future__ import annotations

from typing import ClassVar

import grpc
import pytest
from prometheus_client import REGISTRY

from kvstore.codec import encode_blob
from kvstore.seal import ClusterSecret, Seal, tokens_digest
from prefill_svc.service import PrefillServicer
from serving.worker import blob_spec
from snapstream.v1 import generation_pb2
from tests.integration.test_services import (
    ENGINE_POLICY,
    POLICY,
    collect,
    serving_stack,
    wait_idle,
)

pytestmark = pytest.mark.asyncio(loop_scope="function")
FORGER = ClusterSecret(b"the store's password, not the secret")
DOCUMENT = " ".join(f"Item {i} costs {i * 37 % 1000} coins." for i in range(40))
PROMPT = "The quick brown fox " * 12


def forged_blob(engine, key: str, token_ids: list[int]) -> bytearray:
    """A well-formed blob of the right model and layout, for ``key`` and those tokens, sealed
    without the cluster secret (garbage K/V: whatever a forger wants decode to attend to)."""
    cache = engine.prefill([5] * len(token_ids), ENGINE_POLICY, 8,
                           capacity=engine.context_len).cache
    return encode_blob(cache, blob_spec(engine), Seal(FORGER, key, tokens_digest(token_ids)))


def document_request(question: str) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(prompt=DOCUMENT + question, max_new_tokens=8,
                                          policy=POLICY, cache_prefix_chars=len(DOCUMENT))


async def test_a_planted_document_is_dropped_and_compressed_again(tiny_model_dir, url):
    async with serving_stack(tiny_model_dir, url) as stack:
        first_ids, _, first = await collect(stack.generation, document_request(" Q?"))
        (key,) = [k for k in await stack.store.keys() if k.startswith("prefix-")]
        engine = stack.engine
        doc_ids = engine.tokenizer.encode(DOCUMENT)
        await stack.store.put(key, forged_blob(engine, key, doc_ids), ttl_s=60)
        dropped = REGISTRY.get_sample_value("snapstream_prefix_cache_total",
                                            {"outcome": "dropped", "tenant": "default"}) or 0
        ids, _, again = await collect(stack.generation, document_request(" Q?"))
        assert again.prefix_cache == first.prefix_cache  # stored again, not a hit of the plant
        assert ids == first_ids
        assert REGISTRY.get_sample_value("snapstream_prefix_cache_total", {
            "outcome": "dropped", "tenant": "default"}) == dropped + 1
        for key in await stack.store.keys():
            await stack.store.delete(key)


class ForgingPrefill(PrefillServicer):
    """Replaces the blob it stored with a forged one, ``times`` times (then stores honestly),
    as someone with the store's password could between prefill and decode."""

    times: ClassVar[int] = 1

    async def Prefill(self, request, context):
        response = await super().Prefill(request, context)
        if ForgingPrefill.times > 0:
            ForgingPrefill.times -= 1
            await self.store.put(response.blob_key, forged_blob(
                self.engine, response.blob_key, list(request.prompt_token_ids)), ttl_s=60)
        return response


async def test_a_forged_request_blob_is_rejected_and_the_request_prefilled_again(
        tiny_model_dir, url):
    ForgingPrefill.times = 1
    async with serving_stack(tiny_model_dir, url, prefill_cls=ForgingPrefill) as stack:
        ids, _, complete = await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt=PROMPT, max_new_tokens=12, policy=POLICY))
        assert ids == stack.engine.generate(PROMPT, 12, policy=ENGINE_POLICY).token_ids
        assert complete.completion_tokens == 12
        assert ForgingPrefill.times == 0
        await wait_idle(stack)  # the forged blob was deleted, the second one consumed


async def test_a_blob_forged_every_time_is_refused_with_a_retry_hint(tiny_model_dir, url):
    ForgingPrefill.times = 2
    async with serving_stack(tiny_model_dir, url, prefill_cls=ForgingPrefill) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stack.generation, generation_pb2.GenerateRequest(
                prompt=PROMPT, max_new_tokens=12, policy=POLICY))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "failed its checks" in err.value.details() and "MAC" in err.value.details()
        assert dict(err.value.trailing_metadata())["retry-after"]
        await wait_idle(stack)
