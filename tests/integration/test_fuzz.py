"""Property test over every GenerateRequest field: whatever a client sends, the router answers
OK or a client error (never INTERNAL or UNKNOWN), leaves no blob or row behind, and still
serves a normal request afterwards."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from snapstream.v1 import common_pb2, generation_pb2
from tests.integration.test_services import POLICY, collect, serving_stack, wait_idle

pytestmark = pytest.mark.slow
ALLOWED = {"OK", "INVALID_ARGUMENT", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED"}
UINT32, UINT64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
SMALL_OR_ANY = st.one_of(st.integers(0, 8), UINT32)  # mostly cheap, sometimes anything
FLOATS = st.one_of(st.floats(width=32), st.sampled_from([0.0, 1e-45, 2.17e-38, 1.0, 100.0]))
TEXT = st.text(max_size=120)


def _optional(strategy):
    return st.one_of(st.none(), strategy)


@st.composite
def requests(draw) -> generation_pb2.GenerateRequest:
    request = generation_pb2.GenerateRequest()
    which = draw(st.sampled_from(["prompt", "prompt_token_ids", "messages", None]))
    if which == "prompt":
        request.prompt = draw(TEXT)
    elif which == "prompt_token_ids":
        request.prompt_token_ids.ids.extend(draw(st.lists(st.one_of(st.integers(0, 300), UINT32),
                                                          max_size=40)))
    elif which == "messages":
        request.messages.SetInParent()
        for role, content in draw(st.lists(st.tuples(
                st.one_of(st.sampled_from(["system", "user", "assistant", "tool"]), TEXT),
                TEXT), max_size=3)):
            request.messages.messages.add(role=role, content=content)
    _set(request, "max_new_tokens", draw(_optional(SMALL_OR_ANY)))
    sampling = request.sampling
    for name, strategy in (("temperature", FLOATS), ("top_k", SMALL_OR_ANY), ("top_p", FLOATS),
                           ("seed", UINT64)):
        _set(sampling, name, draw(_optional(strategy)))
    sampling.stop.extend(draw(st.lists(TEXT, max_size=3)))
    sampling.stop_token_ids.extend(draw(st.lists(st.one_of(st.integers(0, 300), UINT32),
                                                 max_size=3)))
    policy = request.policy
    policy.kind = draw(st.integers(0, 6))
    policy.pooling = draw(st.integers(0, 4))
    policy.observe = draw(st.integers(0, 4))
    policy.unit = draw(st.integers(0, 4))
    for name in ("n_sink", "n_topk", "n_recent", "observation", "kernel"):
        _set(policy, name, draw(_optional(st.one_of(st.integers(0, 64), UINT32))))
    return request


def _set(message, name: str, value) -> None:
    if value is not None:
        setattr(message, name, value)


async def _status(stack, request: generation_pb2.GenerateRequest) -> str:
    try:
        await collect(stack.generation, request, timeout=120)
    except grpc.aio.AioRpcError as err:
        return err.code().name
    return "OK"


def test_any_request_gets_a_client_status_and_the_cluster_still_serves(tiny_model_dir,
                                                                        redis_url):
    codes: Counter = Counter()
    with asyncio.Runner() as runner:
        stack_context = serving_stack(tiny_model_dir, redis_url)
        stack = runner.run(stack_context.__aenter__())
        try:
            @settings(max_examples=80, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow])
            @given(requests())
            @example(generation_pb2.GenerateRequest(prompt="ok " * 4, max_new_tokens=2))
            @example(generation_pb2.GenerateRequest(prompt="ok", max_new_tokens=2**32 - 1))
            def check(request: generation_pb2.GenerateRequest) -> None:
                code = runner.run(_status(stack, request))
                codes[code] += 1
                assert code in ALLOWED, (code, request)

            check()
            ids, _, complete = runner.run(collect(stack.generation, generation_pb2.GenerateRequest(
                prompt="still serving " * 5, max_new_tokens=6, policy=POLICY)))
            assert complete.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED and ids
            runner.run(wait_idle(stack))
        finally:
            runner.run(stack_context.__aexit__(None, None, None))
    # the two explicit examples make both certain; random draws are mostly invalid
    assert codes["OK"] and codes["INVALID_ARGUMENT"], codes
