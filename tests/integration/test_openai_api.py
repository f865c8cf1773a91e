"""The OpenAI-compatible HTTP API of the router, over real sockets, in front of a real
prefill/decode stack on a real Redis: the official ``openai`` client (sync and async, streaming
and not), the SSE framing byte by byte, parity with the gRPC path, and bad requests."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx2
import openai
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from router.flow import RequestFlow
from router.openai_api.app import create_app
from router.openai_api.server import HttpServer
from snapstream.v1 import common_pb2, generation_pb2
from tests.integration.test_services import POLICY, Stack, collect, serving_stack, wait_idle

pytestmark = pytest.mark.asyncio(loop_scope="module")
EXTENSION = {"policy": "snapstream", "n_sink": 4, "n_topk": 40, "n_recent": 24, "observation": 8}
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
PROMPTS = ["The quick brown fox " * 12, "naïve café — 東京 " * 5, "x"]


@dataclass
class Served:
    stack: Stack
    base_url: str  # http://127.0.0.1:PORT/v1
    model: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key="unused", max_retries=0)


@contextlib.asynccontextmanager
async def http_api(router: RequestFlow) -> AsyncIterator[str]:
    """The OpenAI API of ``router`` on a free port: -> its base URL."""
    server = HttpServer(create_app(router, lambda: True), "127.0.0.1", 0)
    await server.start()
    try:
        yield server.base_url
    finally:
        await server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tiny_model_dir, redis_url) -> AsyncIterator[Served]:
    async with serving_stack(tiny_model_dir, redis_url) as stack, \
            http_api(stack.router) as base_url:
        yield Served(stack, base_url, stack.router.model.name)


def _grpc_chat(**fields) -> generation_pb2.GenerateRequest:
    messages = generation_pb2.ChatMessages(messages=[
        generation_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in CONVERSATION])
    return generation_pb2.GenerateRequest(messages=messages, policy=POLICY, **fields)


FINISH = {1: "length", 2: "stop", 3: "stop", 4: "length"}  # the native finish reasons


async def test_sync_client_answers_as_the_grpc_path(served):
    def ask() -> tuple:
        with served.client() as client:
            chat = client.chat.completions.create(
                model=served.model, messages=CONVERSATION, max_tokens=12, temperature=0,
                extra_body={"snapstream": EXTENSION})
            streamed = list(client.chat.completions.create(
                model=served.model, messages=CONVERSATION, max_completion_tokens=12,
                temperature=0, stream=True, extra_body={"snapstream": EXTENSION}))
            text = client.completions.create(model=served.model, prompt=PROMPTS[0],
                                             max_tokens=12, extra_body={"snapstream": EXTENSION})
            return chat, streamed, text

    chat, streamed, text = await asyncio.to_thread(ask)
    _, chat_text, chat_done = await collect(served.stack.generation,
                                            _grpc_chat(max_new_tokens=12))
    _, prompt_text, prompt_done = await collect(served.stack.generation,
                                                generation_pb2.GenerateRequest(
                                                    prompt=PROMPTS[0], max_new_tokens=12,
                                                    policy=POLICY))
    assert chat.choices[0].message.content == chat_text
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason == FINISH[chat_done.finish_reason]
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (
        chat_done.prompt_tokens, chat_done.completion_tokens)
    assert chat.system_fingerprint == served.stack.router.decode.model_fingerprint() != ""
    assert streamed[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == chat_text
    assert streamed[-1].choices[0].finish_reason == FINISH[chat_done.finish_reason]
    assert text.choices[0].text == prompt_text and text.object == "text_completion"
    assert text.usage.total_tokens == prompt_done.prompt_tokens + prompt_done.completion_tokens
    await wait_idle(served.stack)


async def test_async_client_streams_with_usage(served):
    async with served.async_client() as client:
        stream = await client.completions.create(
            model=served.model, prompt=PROMPTS[1], max_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"snapstream": EXTENSION})
        chunks = [chunk async for chunk in stream]
        chat = await client.chat.completions.create(
            model=served.model, messages=CONVERSATION, max_tokens=10, stream=True,
            stream_options={"include_usage": True}, extra_body={"snapstream": EXTENSION})
        chat_chunks = [chunk async for chunk in chat]
    _, text, done = await collect(served.stack.generation, generation_pb2.GenerateRequest(
        prompt=PROMPTS[1], max_new_tokens=10, policy=POLICY))
    *deltas, finish, last = chunks
    assert "".join(c.choices[0].text for c in deltas) == text
    assert finish.choices[0].finish_reason == FINISH[done.finish_reason]
    assert finish.model_extra["snapstream"]["kv_cache_slots"] == done.kv_cache_slots
    assert last.choices == [] and last.usage.completion_tokens == done.completion_tokens
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("cmpl-")
    assert chat_chunks[-1].choices == [] and chat_chunks[-1].usage.total_tokens > 0
    assert chat_chunks[-2].choices[0].finish_reason in ("stop", "length")
    await wait_idle(served.stack)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_greedy_tokens_equal_the_grpc_path(served, stream):
    tokenizer = served.stack.engine.tokenizer
    async with served.async_client() as client:
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt)
            expected, _, _ = await collect(served.stack.generation,
                                           generation_pb2.GenerateRequest(
                                               prompt_token_ids=common_pb2.TokenIds(ids=ids),
                                               max_new_tokens=16, policy=POLICY))
            response = await client.completions.create(
                model=served.model, prompt=ids, max_tokens=16, temperature=0, stream=stream,
                extra_body={"snapstream": {**EXTENSION, "return_token_ids": True}})
            choices = ([c.choices[0] async for c in response if c.choices] if stream
                       else response.choices)
            got = [t for choice in choices for t in choice.model_extra["token_ids"]]
            assert got == expected, prompt
    await wait_idle(served.stack)


async def test_server_sent_events_are_framed_as_openai_frames_them(served):
    body = {"model": served.model, "messages": CONVERSATION, "max_tokens": 8, "stream": True,
            "stream_options": {"include_usage": True}, "snapstream": EXTENSION}
    async with httpx2.AsyncClient(base_url=served.base_url) as client, \
            client.stream("POST", "/chat/completions", json=body) as response:
        raw = b"".join([chunk async for chunk in response.aiter_bytes()])
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert raw.endswith(b"\n\ndata: [DONE]\n\n")
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    payloads = [json.loads(event.removeprefix(b"data: ")) for event in events[:-2]]
    assert all(event.startswith(b"data: {") and b"\n" not in event for event in events[:-2])
    assert {p["object"] for p in payloads} == {"chat.completion.chunk"}
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert payloads[-2]["choices"][0]["delta"] == {}
    assert payloads[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] > 0
    await wait_idle(served.stack)


async def test_models_health_and_unknown_paths(served):
    async with served.async_client() as client:
        listed = await client.models.list()
        assert [m.id for m in listed.data] == [served.model]
        assert (await client.models.retrieve(served.model)).id == served.model
        with pytest.raises(openai.NotFoundError) as err:
            await client.models.retrieve("gpt-4o")
        assert err.value.body["code"] == "model_not_found"
    async with httpx2.AsyncClient(base_url=served.base_url.removesuffix("/v1")) as client:
        assert (await client.get("/health")).json() == {"status": "ok"}
        missing = await client.get("/v1/nothing")
        wrong_method = await client.get("/v1/chat/completions")
    assert missing.status_code == 404 and "error" in missing.json()
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def metric(api: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("snapstream_requests_total",
                                     {"service": "router", "api": api, "outcome": outcome}) or 0


async def test_requests_are_counted_by_api(served):
    before = metric("openai", "ok"), metric("grpc", "ok")
    async with served.async_client() as client:
        await client.completions.create(model=served.model, prompt="count me", max_tokens=2)
    await collect(served.stack.generation, generation_pb2.GenerateRequest(
        prompt="count me", max_new_tokens=2))
    assert (metric("openai", "ok"), metric("grpc", "ok")) == (before[0] + 1, before[1] + 1)


async def test_the_benchmarks_openai_load_generator_sees_the_grpc_tokens(served):
    from bench.serve_openai import OpenAIClient, served_model
    from bench.serve_workload import ServeBenchConfig
    from snapstream.policy import CachePolicy

    policy = CachePolicy(n_sink=4, n_topk=40, n_recent=24, observation=8)
    ids = served.stack.engine.tokenizer.encode(PROMPTS[0])
    expected, _, _ = await collect(served.stack.generation, generation_pb2.GenerateRequest(
        prompt_token_ids=common_pb2.TokenIds(ids=ids), max_new_tokens=16, policy=POLICY))
    async with served.async_client() as client:
        model = await served_model(client)
        cfg = ServeBenchConfig(max_new_tokens=16, policy=policy)
        trace = await OpenAIClient(client, model, cfg).generate(ids)
    assert model == served.model
    assert list(trace.token_ids) == expected and len(trace.arrivals) == len(expected)
    assert trace.sent < trace.arrivals[0] <= trace.arrivals[-1]
