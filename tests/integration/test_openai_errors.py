"""What goes wrong over the OpenAI API: bad bodies get a 4xx with an OpenAI error object (never
a 500), an overloaded or unreachable prefill tier gets 429 or 503 with Retry-After, and a client
that disconnects leaves no blob and no busy row behind."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx2
import pytest
import pytest_asyncio

from router.flow import RequestFlow
from router.openai_api.app import MAX_BODY_BYTES
from router.workers import WorkerPool
from snapstream.v1 import prefill_pb2_grpc
from tests.conftest import TINY_MODEL_NAME
from tests.integration.test_openai_api import (
    CONVERSATION,
    EXTENSION,
    Served,
    http_api,
    metric,
)
from tests.integration.test_services import serving_stack, wait_idle

pytestmark = pytest.mark.asyncio(loop_scope="module")
CHAT, TEXT = "/chat/completions", "/completions"
MODEL = TINY_MODEL_NAME  # tests/conftest.py's tiny_model_dir, as the router names it


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": CONVERSATION, "max_tokens": 4, **fields}


def text(**fields) -> dict:
    return {"model": MODEL, "prompt": "hello", "max_tokens": 4, **fields}


def without(body: dict, name: str) -> dict:
    return {key: value for key, value in body.items() if key != name}


# (path, body, expected status, a fragment of the message, the field named as param)
BAD_BODIES = {
    "missing-model": (CHAT, without(chat(), "model"), 400, "model: Field required", "model"),
    "unknown-model": (CHAT, chat(model="gpt-4o"), 404, "'gpt-4o' is not served", "model"),
    "model-not-a-string": (CHAT, chat(model=5), 400, "model: Input should be a valid string",
                           "model"),
    "missing-messages": (CHAT, without(chat(), "messages"), 400, "messages: Field required",
                         "messages"),
    "empty-messages": (CHAT, chat(messages=[]), 400, "messages is empty", None),
    "messages-not-a-list": (CHAT, chat(messages="hi"), 400, "messages:", "messages"),
    "content-not-text": (CHAT, chat(messages=[{"role": "user", "content": 5}]), 400,
                         "messages.0.content", None),
    "image-content": (CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]), 400, "messages.0.content",
        None),
    "unknown-role": (CHAT, chat(messages=[{"role": "robot", "content": "hi"}]), 400,
                     "messages[0].role: unknown 'robot'", None),
    "role-not-a-string": (CHAT, chat(messages=[{"role": 1, "content": "hi"}]), 400,
                          "messages.0.role", "messages.0.role"),
    "max-tokens-string": (CHAT, chat(max_tokens="12"), 400, "max_tokens: Input should be",
                          "max_tokens"),
    "max-tokens-float": (CHAT, chat(max_tokens=1.5), 400, "max_tokens", "max_tokens"),
    "max-tokens-negative": (CHAT, chat(max_tokens=-1), 400, "max_tokens", "max_tokens"),
    "max-tokens-zero": (CHAT, chat(max_tokens=0), 400, "max_new_tokens must be in", None),
    "both-max-tokens": (CHAT, chat(max_completion_tokens=3), 400, "not both", "max_tokens"),
    "max-completion-tokens-string": (CHAT, without(chat(max_completion_tokens="x"),
                                                   "max_tokens"), 400,
                                     "max_completion_tokens", "max_completion_tokens"),
    "temperature-string": (CHAT, chat(temperature="hot"), 400, "temperature", "temperature"),
    "temperature-negative": (CHAT, chat(temperature=-1), 400, "temperature must be in", None),
    "top-p-too-large": (CHAT, chat(top_p=1.5), 400, "top_p must be in", None),
    "top-p-string": (CHAT, chat(top_p="x"), 400, "top_p", "top_p"),
    "top-k-negative": (CHAT, chat(top_k=-1), 400, "top_k", "top_k"),
    "seed-string": (CHAT, chat(seed="7"), 400, "seed", "seed"),
    "seed-negative": (CHAT, chat(seed=-7), 400, "seed", "seed"),
    "stop-number": (CHAT, chat(stop=5), 400, "stop", None),
    "stop-list-of-numbers": (CHAT, chat(stop=[1]), 400, "stop", None),
    "stop-too-many": (CHAT, chat(stop=["a"] * 17), 400, "sampling.stop has 17", None),
    "n-two": (CHAT, chat(n=2), 400, "n is not supported", "n"),
    "n-string": (CHAT, chat(n="1"), 400, "n: Input should be", "n"),
    "stream-string": (CHAT, chat(stream="yes"), 400, "stream: Input should be", "stream"),
    "stream-options-wrong": (CHAT, chat(stream=True, stream_options={"include_usage": "y"}),
                             400, "stream_options.include_usage", None),
    "user-number": (CHAT, chat(user=5), 400, "user", "user"),
    "logprobs": (CHAT, chat(logprobs=True), 400, "logprobs is not supported", "logprobs"),
    "tools": (CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400,
              "tools is not supported", "tools"),
    "penalty": (CHAT, chat(presence_penalty=0.5), 400, "presence_penalty is not supported",
                "presence_penalty"),
    "unknown-field": (CHAT, chat(frobnicate=1), 400, "frobnicate: Extra inputs", "frobnicate"),
    "extension-not-an-object": (CHAT, chat(snapstream=5), 400, "snapstream", "snapstream"),
    "unknown-policy": (CHAT, chat(snapstream={"policy": "lru"}), 400, "snapstream.policy",
                       "snapstream.policy"),
    "policy-size-string": (CHAT, chat(snapstream={"n_topk": "big"}), 400, "snapstream.n_topk",
                           "snapstream.n_topk"),
    "policy-over-budget": (CHAT, chat(snapstream={**EXTENSION, "n_topk": 5000}), 400, "budget",
                           None),
    "policy-even-kernel": (CHAT, chat(snapstream={"kernel": 4}), 400, "kernel", None),
    "unknown-extension-field": (CHAT, chat(snapstream={"budget": 1}), 400, "snapstream.budget",
                                None),
    "prompt-number": (TEXT, text(prompt=5), 400, "prompt", None),
    "prompt-empty": (TEXT, text(prompt=""), 400, "prompt is empty", None),
    "prompt-empty-list": (TEXT, text(prompt=[]), 400, "give one prompt", "prompt"),
    "prompt-batch": (TEXT, text(prompt=["a", "b"]), 400, "give one prompt", "prompt"),
    "prompt-token-batch": (TEXT, text(prompt=[[1, 2]]), 400, "prompt", None),
    "prompt-negative-token": (TEXT, text(prompt=[-1]), 400, "prompt", None),
    "prompt-token-outside-vocabulary": (TEXT, text(prompt=[99999]), 400,
                                        "outside the vocabulary", None),
    "prompt-too-long": (TEXT, text(prompt="word " * 3000), 400, "the model's context", None),
    "echo": (TEXT, text(echo=True), 400, "echo is not supported", "echo"),
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tiny_model_dir, redis_url):
    async with serving_stack(tiny_model_dir, redis_url) as stack, \
            http_api(stack.router) as base_url:
        assert stack.router.model.name == MODEL
        yield Served(stack, base_url, MODEL)


def check_error_object(response: httpx2.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"]
    return error


@pytest.mark.parametrize(("path", "body", "status", "message", "param"), BAD_BODIES.values(),
                         ids=BAD_BODIES.keys())
async def test_a_bad_body_gets_an_openai_error(served, path, body, status, message, param):
    async with httpx2.AsyncClient(base_url=served.base_url) as client:
        response = await client.post(path, json=body)
    error = check_error_object(response, status)
    assert message in error["message"]
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize("content", [b"{not json", b"", b"\xff\xfe", b"[]", b"null"],
                         ids=["broken", "empty", "not-utf8", "array", "null"])
async def test_a_body_that_is_not_a_json_object_is_400(served, content):
    async with httpx2.AsyncClient(base_url=served.base_url) as client:
        response = await client.post(CHAT, content=content,
                                     headers={"content-type": "application/json"})
    check_error_object(response, 400)


async def test_an_oversized_body_is_413_declared_or_streamed(served):
    big = json.dumps(chat(messages=[{"role": "user", "content": "x" * MAX_BODY_BYTES}])).encode()

    async def in_pieces():
        for start in range(0, len(big), 2**16):
            yield big[start:start + 2**16]

    async with httpx2.AsyncClient(base_url=served.base_url) as client:
        declared = await client.post(CHAT, content=big)
        streamed = await client.post(CHAT, content=in_pieces())  # chunked: no length given
    for response in (declared, streamed):
        assert check_error_object(response, 413)["code"] == "request_too_large"
    await wait_idle(served.stack)


async def _first_events(response: httpx2.Response, count: int) -> None:
    seen = 0
    async for line in response.aiter_lines():
        seen += line.startswith("data: {")
        if seen == count:
            return
    raise AssertionError(f"the stream ended after {seen} events")


def _outcomes() -> tuple[float, float]:
    """Requests counted as served, and as cancelled by their client (not as errors)."""
    return metric("openai", "ok"), metric("openai", "cancelled")


async def test_a_client_that_leaves_mid_stream_frees_its_row_and_blob(served):
    stack, before = served.stack, _outcomes()
    body = text(prompt="leave me " * 20, max_tokens=2000, stream=True, snapstream=EXTENSION)
    async with httpx2.AsyncClient(base_url=served.base_url) as client, \
            client.stream("POST", TEXT, json=body) as response:
        await _first_events(response, 3)
        assert stack.loop.stats().running == 1
    await wait_idle(stack)  # every blob deleted, every row free
    assert _outcomes() == (before[0], before[1] + 1)  # cut short, not run to its end


async def test_a_client_that_leaves_before_the_answer_frees_its_row_and_blob(served):
    stack, before = served.stack, _outcomes()
    async with httpx2.AsyncClient(base_url=served.base_url) as client:
        call = asyncio.ensure_future(client.post(TEXT, json=text(
            prompt="wait for me " * 20, max_tokens=2000, snapstream=EXTENSION)))
        for _ in range(500):
            if stack.loop.stats().running == 1:
                break
            await asyncio.sleep(0.01)
        assert stack.loop.stats().running == 1
        call.cancel()  # closes the connection, as a client that gives up does
        with contextlib.suppress(asyncio.CancelledError):
            await call
    await wait_idle(stack)
    assert _outcomes() == (before[0], before[1] + 1)


async def _post_both_ways(base_url: str) -> list[httpx2.Response]:
    async with httpx2.AsyncClient(base_url=base_url) as client:
        return [await client.post(CHAT, json=chat(stream=stream)) for stream in (False, True)]


async def test_no_reachable_prefill_worker_is_503_with_retry_after(served, unused_port):
    prefill = WorkerPool("prefill", (f"127.0.0.1:{unused_port}",),
                         prefill_pb2_grpc.PrefillStub, "least_outstanding")
    await prefill.refresh()
    router = RequestFlow(served.stack.router.model, prefill, served.stack.router.decode)
    try:
        async with http_api(router) as base_url:
            responses = await _post_both_ways(base_url)
    finally:
        await prefill.close()
    for response in responses:
        assert check_error_object(response, 503)["message"].startswith("no prefill worker")
        assert response.headers["retry-after"] == "1"


async def test_a_full_prefill_tier_is_429_with_retry_after(tiny_model_dir, redis_url):
    # a real prefill worker that queues nothing, not even one prompt: always full
    async with serving_stack(tiny_model_dir, redis_url, prefill_queue=-1) as stack, \
            http_api(stack.router) as base_url:
        responses = await _post_both_ways(base_url)
    for response in responses:
        assert check_error_object(response, 429)["code"] == "overloaded"
        assert response.headers["retry-after"] == "1"
