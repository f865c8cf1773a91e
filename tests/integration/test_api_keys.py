"""API keys at the router, on both APIs, over real sockets in front of a real prefill/decode
stack: UNAUTHENTICATED / 401 without an accepted key, the call served with one, health open."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import httpx2
import pytest
import pytest_asyncio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from router.openai_api.app import create_app
from router.openai_api.server import HttpServer
from router.service import GenerationServicer
from serving.auth import ApiKeyInterceptor, ApiKeys
from serving.errors import StatusInterceptor
from snapstream.client import AsyncSnapstreamClient, Unauthenticated
from snapstream.v1 import generation_pb2, generation_pb2_grpc
from tests.conftest import TINY_MODEL_NAME
from tests.integration.test_services import serving_stack

pytestmark = pytest.mark.asyncio(loop_scope="module")
KEY, OTHER_KEY = "k" * 20 + "-first", "k" * 20 + "-second"
MODEL = TINY_MODEL_NAME  # tests/conftest.py's tiny_model_dir, as the router names it


@dataclass
class Router:
    address: str  # gRPC host:port
    base_url: str  # the OpenAI API


@contextlib.asynccontextmanager
async def keyed_router(stack, keys: ApiKeys) -> AsyncIterator[Router]:
    """The stack's generation path behind the router's interceptors and HTTP app, with keys."""
    server = grpc.aio.server(interceptors=[ApiKeyInterceptor(keys), StatusInterceptor()])
    generation_pb2_grpc.add_GenerationServicer_to_server(GenerationServicer(stack.router), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    http = HttpServer(create_app(stack.router, lambda: True, keys), "127.0.0.1", 0)
    await http.start()
    try:
        yield Router(f"127.0.0.1:{port}", http.base_url)
    finally:
        await http.stop()
        await server.stop(grace=None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def router(tiny_model_dir, redis_url) -> AsyncIterator[Router]:
    async with serving_stack(tiny_model_dir, redis_url) as stack, \
            keyed_router(stack, ApiKeys.of([KEY, OTHER_KEY])) as keyed:
        yield keyed


@pytest.mark.parametrize("key", [KEY, OTHER_KEY])
async def test_grpc_with_a_key_is_served(router, key):
    async with AsyncSnapstreamClient(router.address, timeout_s=30, api_key=key) as client:
        assert (await client.generate("hello", max_new_tokens=3)).completion_tokens == 3
        assert (await client.info()).model_name == MODEL


@pytest.mark.parametrize(("key", "message"), [
    (None, "an API key is required"), (KEY + "x", "not valid"), (KEY[:-1], "not valid")],
    ids=["none", "longer", "shorter"])
async def test_grpc_without_an_accepted_key_is_unauthenticated(router, key, message,
                                                                monkeypatch):
    monkeypatch.delenv("SNAPSTREAM_API_KEY", raising=False)
    async with AsyncSnapstreamClient(router.address, timeout_s=30, api_key=key) as client:
        with pytest.raises(Unauthenticated, match=message):
            await client.generate("hello", max_new_tokens=3)
        with pytest.raises(Unauthenticated, match=message):
            await client.info()


async def test_the_sdk_takes_its_key_from_the_environment(router, monkeypatch):
    monkeypatch.setenv("SNAPSTREAM_API_KEY", KEY)
    async with AsyncSnapstreamClient(router.address, timeout_s=30) as client:
        assert (await client.generate("hello", max_new_tokens=2)).completion_tokens == 2


async def test_a_key_in_another_scheme_is_refused(router):
    async with grpc.aio.insecure_channel(router.address) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Info(generation_pb2.InfoRequest(),
                            metadata=(("authorization", f"Basic {KEY}"),), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_grpc_health_stays_open(router):
    async with grpc.aio.insecure_channel(router.address) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert response.status == health_pb2.HealthCheckResponse.SERVING


BODY = {"model": MODEL, "prompt": "hello", "max_tokens": 2}


@pytest.mark.parametrize(("headers", "message"), [
    ({}, "an API key is required"), ({"authorization": "Bearer nope"}, "not valid"),
    ({"authorization": KEY}, "not valid")], ids=["none", "wrong", "no-scheme"])
@pytest.mark.parametrize(("method", "path"), [("POST", "/completions"), ("GET", "/models"),
                                              ("GET", "/nowhere")])
async def test_http_without_an_accepted_key_is_401(router, headers, message, method, path):
    async with httpx2.AsyncClient(base_url=router.base_url) as client:
        response = await client.request(method, path, headers=headers,
                                        json=BODY if method == "POST" else None)
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key" and message in error["message"]


async def test_http_with_a_key_is_served_and_health_is_open(router):
    async with httpx2.AsyncClient(base_url=router.base_url) as client:
        served = await client.post("/completions", json=BODY,
                                   headers={"authorization": f"Bearer {OTHER_KEY}"})
        health_check = await client.get(router.base_url.removesuffix("/v1") + "/health")
    assert served.status_code == 200, served.text
    assert served.json()["usage"]["completion_tokens"] == 2
    assert health_check.status_code == 200
