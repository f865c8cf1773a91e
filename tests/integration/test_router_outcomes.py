"""The router under overload and at the edges of a request's life, over real sockets and a real
Redis: decode workers that are full are tried again with backoff (no request lost), overload
comes with a retry hint, a prefill cut short after its put leaves no blob, a store that is down
is named, and every outcome is counted under its own label (client cancels and bad requests are
not errors)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from prefill_svc.service import PrefillServicer
from serving.errors import RETRY_AFTER_S
from snapstream.client import AsyncSnapstreamClient, InvalidArgument, ResourceExhausted
from snapstream.engine import Engine
from snapstream.v1 import generation_pb2
from tests.integration.conftest import start_server
from tests.integration.test_openai_api import metric
from tests.integration.test_services import (
    ENGINE_POLICY,
    POLICY,
    _long_stream_under_way,
    collect,
    serving_stack,
    wait_idle,
)

PROMPTS = ["full house " * 6, "wait your turn " * 4, "x", "0123456789" * 3, "naïve " * 5]


async def test_full_decode_workers_are_retried_until_every_stream_is_served(tiny_model_dir,
                                                                          redis_url):
    engine = Engine.from_pretrained(tiny_model_dir)
    # one row and one place in the queue: most of the streams are refused at first
    async with serving_stack(tiny_model_dir, redis_url, rows=1, max_queue=1) as stack:
        results = await asyncio.gather(*(
            collect(stack.generation, generation_pb2.GenerateRequest(
                prompt=prompt, max_new_tokens=16, policy=POLICY), timeout=120)
            for prompt in PROMPTS))
        for prompt, (ids, _, complete) in zip(PROMPTS, results, strict=True):
            expected = engine.generate(prompt, max_new_tokens=16, policy=ENGINE_POLICY)
            assert ids == expected.token_ids
            assert complete.completion_tokens == 16
        await wait_idle(stack)


class HeldPrefill(PrefillServicer):
    """A prefill worker whose answer is held after its blob is stored, until ``release``: the
    window in which a client that leaves used to leave the blob to its TTL."""

    stored = asyncio.Event()
    release = asyncio.Event()

    async def Prefill(self, request, context):
        response = await super().Prefill(request, context)
        HeldPrefill.stored.set()
        await HeldPrefill.release.wait()
        return response


async def test_a_client_that_leaves_between_the_put_and_the_answer_leaves_no_blob(
        tiny_model_dir, redis_url):
    HeldPrefill.stored, HeldPrefill.release = asyncio.Event(), asyncio.Event()
    async with serving_stack(tiny_model_dir, redis_url, prefill_cls=HeldPrefill) as stack:
        call = stack.generation.Generate(generation_pb2.GenerateRequest(
            prompt="leave early " * 10, max_new_tokens=8, policy=POLICY))
        reading = asyncio.ensure_future(call.read())
        await HeldPrefill.stored.wait()
        assert len(await stack.store.keys()) == 1
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        HeldPrefill.release.set()
        await wait_idle(stack)  # the router released the key it gave the prefill


class LosingPrefill(PrefillServicer):
    """A prefill worker whose blob is gone by the time decode reads it, as after a store
    restart without persistence."""

    async def Prefill(self, request, context):
        response = await super().Prefill(request, context)
        await self.store.delete(response.blob_key)
        return response


async def test_a_blob_the_store_lost_is_unavailable_not_not_found(tiny_model_dir, redis_url):
    async with serving_stack(tiny_model_dir, redis_url, prefill_cls=LosingPrefill) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stack.generation, generation_pb2.GenerateRequest(
                prompt="where did it go " * 4, max_new_tokens=8, policy=POLICY), timeout=60)
        await wait_idle(stack)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "KV cache is gone from the store" in err.value.details()
    assert "retry" in err.value.details()


async def test_a_store_that_is_down_is_named(tiny_model_dir, tmp_path: Path):
    server = start_server("redis", tmp_path)
    async with serving_stack(tiny_model_dir, server.url) as stack:
        server.stop()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stack.generation, generation_pb2.GenerateRequest(
                prompt="is anyone there", max_new_tokens=4, policy=POLICY), timeout=60)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no prefill worker could serve the request" in err.value.details()
    assert f"KV store {server.url.split('/0')[0]}" in err.value.details()


def _counts(*outcomes: str) -> tuple[float, ...]:
    return tuple(metric("grpc", outcome) for outcome in outcomes)


OUTCOMES = ("ok", "cancelled", "invalid_argument", "internal", "unavailable")


async def test_outcomes_count_bad_requests_and_cancels_apart_from_errors(tiny_model_dir,
                                                                         redis_url):
    async with serving_stack(tiny_model_dir, redis_url) as stack:
        before = _counts(*OUTCOMES)
        with pytest.raises(grpc.aio.AioRpcError):
            await collect(stack.generation, generation_pb2.GenerateRequest(prompt=""))
        call = await _long_stream_under_way(stack, "cancel me " * 20)
        call.cancel()
        await wait_idle(stack)
        await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt="fine", max_new_tokens=2, policy=POLICY))
        after = _counts(*OUTCOMES)
    assert dict(zip(OUTCOMES, (b - a for a, b in zip(before, after, strict=True)),
                    strict=True)) == {"ok": 1, "cancelled": 1, "invalid_argument": 1,
                                      "internal": 0, "unavailable": 0}


async def test_overload_comes_with_a_retry_hint(tiny_model_dir, redis_url):
    # a real prefill worker that queues nothing, not even one prompt: always full
    async with serving_stack(tiny_model_dir, redis_url, prefill_queue=-1) as stack:
        (address,) = stack.router.prefill.addresses  # the stack's one server
        async with AsyncSnapstreamClient(address, timeout_s=30) as client:
            with pytest.raises(ResourceExhausted, match="every prefill worker's queue is full"
                               ) as full:
                await client.generate("too much", max_new_tokens=2)
            with pytest.raises(InvalidArgument) as bad:
                await client.generate("", max_new_tokens=2)
    assert full.value.retry_after_s == RETRY_AFTER_S
    assert bad.value.retry_after_s is None
