"""Compress once, ask many, through the router: the gRPC API, the SDK's fields and the OpenAI
API (the official ``openai`` client) in front of a real prefill/decode stack on a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import openai
import pytest
import pytest_asyncio

from snapstream.client.results import CompletionBuilder
from snapstream.v1 import common_pb2, generation_pb2
from tests.integration.test_openai_api import Served, http_api
from tests.integration.test_services import POLICY, collect, serving_stack

pytestmark = pytest.mark.asyncio(loop_scope="module")
EXTENSION = {"policy": "snapstream", "n_sink": 4, "n_topk": 40, "n_recent": 24, "observation": 8}
DOCUMENT = ("The lighthouse keeper wrote down the tide every morning. " * 6
            + "The secret code is 4711. " + "Gulls circled over the harbour all day. " * 6)
STORED, HIT = common_pb2.PREFIX_CACHE_STORED, common_pb2.PREFIX_CACHE_HIT


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tiny_model_dir, redis_url) -> AsyncIterator[Served]:
    async with serving_stack(tiny_model_dir, redis_url) as stack, \
            http_api(stack.router) as base_url:
        yield Served(stack, base_url, stack.router.model.name)
        for key in await stack.store.keys():  # the stored documents: the next modules share
            await stack.store.delete(key)     # this Redis and expect it empty when idle


def text_request(document: str, question: str, policy=POLICY, **fields
                 ) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(prompt=document + question, max_new_tokens=8,
                                          policy=policy, cache_prefix_chars=len(document),
                                          **fields)


def chat_request(document: str, question: str) -> generation_pb2.GenerateRequest:
    messages = generation_pb2.ChatMessages(messages=[
        generation_pb2.ChatMessage(role="system", content=document),
        generation_pb2.ChatMessage(role="user", content=question)])
    return generation_pb2.GenerateRequest(messages=messages, max_new_tokens=8, policy=POLICY,
                                          cache_prefix="system")


async def test_the_first_request_stores_the_document_and_the_next_hit_it(served):
    stub = served.stack.generation
    document = "grpc: " + DOCUMENT
    first_ids, _, first = await collect(stub, text_request(document, " What is the code?"))
    again_ids, _, again = await collect(stub, text_request(document, " What is the code?"))
    _, _, other = await collect(stub, text_request(document, " Who wrote the tide?"))
    assert (first.prefix_cache, again.prefix_cache, other.prefix_cache) == (STORED, HIT, HIT)
    assert again_ids == first_ids  # the same prompt answers alike from the stored document
    assert first.kv_cache_slots == 4 + 40 + 24
    _, _, plain = await collect(stub, generation_pb2.GenerateRequest(
        prompt=document + " What is the code?", max_new_tokens=8, policy=POLICY))
    assert plain.prefix_cache == common_pb2.PREFIX_CACHE_UNSPECIFIED


async def test_concurrent_first_requests_compress_once(served):
    document = "concurrent: " + DOCUMENT
    results = await asyncio.gather(*(
        collect(served.stack.generation, text_request(document, f" Question {i}?"))
        for i in range(3)))
    assert sorted(complete.prefix_cache for _, _, complete in results) == [STORED, HIT, HIT]


async def test_keys_do_not_collide_across_policies(served):
    document = "policies: " + DOCUMENT
    smaller = common_pb2.CachePolicy(kind=common_pb2.POLICY_KIND_SNAPSTREAM, n_sink=4,
                                     n_topk=32, n_recent=24, observation=8)
    outcomes = [(await collect(served.stack.generation, text_request(document, " Q?", p)))[2]
                .prefix_cache for p in (POLICY, smaller, smaller, POLICY)]
    assert outcomes == [STORED, STORED, HIT, HIT]


async def test_chat_caches_the_system_message_and_the_sdk_reads_it(served):
    builder = CompletionBuilder()
    async for message in served.stack.generation.Generate(
            chat_request("chat: " + DOCUMENT, "What is the code?")):
        builder.add(message)
    assert builder.finish().prefix_cache == "stored"
    builder = CompletionBuilder()
    async for message in served.stack.generation.Generate(
            chat_request("chat: " + DOCUMENT, "Who wrote the tide?")):
        builder.add(message)
    assert builder.finish().prefix_cache == "hit"


BAD_REQUESTS = {
    "must be less than the prompt's": text_request(DOCUMENT, ""),
    "cache_prefix_chars marks a document of": text_request(DOCUMENT * 12, " Q?"),
    "cache_prefix needs a policy that bounds": text_request(
        DOCUMENT, " Q?", common_pb2.CachePolicy(kind=common_pb2.POLICY_KIND_FULL)),
    "cache_prefix applies to messages": generation_pb2.GenerateRequest(
        prompt=DOCUMENT, cache_prefix="system"),
    "no system message to cache": generation_pb2.GenerateRequest(
        messages=generation_pb2.ChatMessages(messages=[
            generation_pb2.ChatMessage(role="user", content=DOCUMENT)]),
        policy=POLICY, cache_prefix="system"),
    "cache_prefix must be one of": generation_pb2.GenerateRequest(
        messages=generation_pb2.ChatMessages(messages=[
            generation_pb2.ChatMessage(role="system", content=DOCUMENT)]),
        policy=POLICY, cache_prefix="last"),
    "cache_prefix and speculative cannot be combined": generation_pb2.GenerateRequest(
        prompt=DOCUMENT + " Q?", policy=POLICY, cache_prefix_chars=len(DOCUMENT),
        speculative=common_pb2.SpeculativeSettings(keep=0.5)),
}


@pytest.mark.parametrize("message", BAD_REQUESTS)
async def test_bad_marks_are_invalid_argument(served, message):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await collect(served.stack.generation, BAD_REQUESTS[message])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details()


def _usage_cache(usage) -> str:
    return usage.model_dump()["snapstream"]["prefix_cache"]


async def test_openai_chat_reports_stored_then_hit_also_when_streaming(served):
    messages = [{"role": "system", "content": "openai chat: " + DOCUMENT},
                {"role": "user", "content": "What is the code?"}]
    extension = {**EXTENSION, "cache_prefix": "system"}

    def ask():
        with served.client() as client:
            first = client.chat.completions.create(
                model=served.model, messages=messages, max_tokens=6, temperature=0,
                extra_body={"snapstream": extension})
            chunks = list(client.chat.completions.create(
                model=served.model, messages=messages, max_tokens=6, temperature=0,
                stream=True, stream_options={"include_usage": True},
                extra_body={"snapstream": extension}))
            return first, chunks

    first, chunks = await asyncio.to_thread(ask)
    assert _usage_cache(first.usage) == "stored"
    assert chunks[-1].choices == [] and _usage_cache(chunks[-1].usage) == "hit"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == first.choices[0].message.content


async def test_openai_completion_marks_its_first_characters(served):
    document = "openai text: " + DOCUMENT

    def ask(question: str, **extra):
        with served.client() as client:
            return client.completions.create(
                model=served.model, prompt=document + question, max_tokens=6, temperature=0,
                extra_body={"snapstream": {**EXTENSION, "cache_prefix_chars": len(document),
                                           **extra}})

    assert _usage_cache((await asyncio.to_thread(ask, " Q1?")).usage) == "stored"
    assert _usage_cache((await asyncio.to_thread(ask, " Q2?")).usage) == "hit"
    with pytest.raises(openai.BadRequestError, match="cache_prefix applies to chat"):
        await asyncio.to_thread(ask, " Q3?", cache_prefix="system")

    def too_long():
        with served.client() as client:
            client.completions.create(
                model=served.model, prompt=document, max_tokens=6,
                extra_body={"snapstream": {**EXTENSION, "cache_prefix_chars": len(document)}})

    with pytest.raises(openai.BadRequestError, match="must be less than the prompt's"):
        await asyncio.to_thread(too_long)
