"""A client's mistake against an internal fault, over real gRPC and HTTP: a bad request answers
INVALID_ARGUMENT / 400 naming the field; an engine fault answers INTERNAL / 500 with a request
id, whose traceback the log holds under that id, and never the fault's own text; a request the
server was not started for answers FAILED_PRECONDITION / 412 with its message."""

from __future__ import annotations

import logging
import re

import grpc
import httpx2
import pytest
import pytest_asyncio

from prefill_svc.service import PrefillServicer
from serving.errors import REQUEST_ID_KEY
from snapstream.v1 import generation_pb2
from tests.integration.test_openai_api import http_api
from tests.integration.test_services import POLICY, collect, serving_stack, wait_idle

FAULT = "an engine invariant broke: it should not have been compressed"
REQUEST_ID = re.compile(r"request id ([0-9a-f]{32})")
pytestmark = pytest.mark.asyncio(loop_scope="module")


class FaultyPrefill(PrefillServicer):
    """A prefill worker whose model thread fails as an engine bug would (a ValueError)."""

    def _run_model(self, *args, **kwargs):
        raise ValueError(FAULT)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def faulty(tiny_model_dir, redis_url):
    async with serving_stack(tiny_model_dir, redis_url, prefill_cls=FaultyPrefill) as stack, \
            http_api(stack.router) as base_url:
        yield stack, base_url


def _logged_ids(caplog: pytest.LogCaptureFixture) -> dict[str, logging.LogRecord]:
    return {record.args[0]: record for record in caplog.records
            if record.levelno == logging.ERROR and record.exc_info is not None
            and record.msg.startswith("request %s: internal error")}


async def test_an_internal_fault_is_internal_with_a_request_id_over_grpc(faulty, caplog):
    stack, _ = faulty
    caplog.set_level(logging.ERROR)
    call = stack.generation.Generate(generation_pb2.GenerateRequest(
        prompt="a question", max_new_tokens=4, policy=POLICY))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in call:
            pass
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert FAULT not in err.value.details()
    (request_id,) = REQUEST_ID.findall(err.value.details())
    assert dict(err.value.trailing_metadata())[REQUEST_ID_KEY] == request_id
    record = _logged_ids(caplog)[request_id]  # the prefill worker's, under the router's id
    assert FAULT in str(record.exc_info[1])
    await wait_idle(stack)


async def test_an_internal_fault_is_500_with_a_request_id_over_http(faulty, caplog):
    stack, base_url = faulty
    caplog.set_level(logging.ERROR)
    async with httpx2.AsyncClient(base_url=base_url) as http:
        response = await http.post("/completions", json={
            "model": stack.router.model.name, "prompt": "a question", "max_tokens": 4})
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "internal_error")
    assert FAULT not in error["message"]
    (request_id,) = REQUEST_ID.findall(error["message"])
    assert FAULT in str(_logged_ids(caplog)[request_id].exc_info[1])
    await wait_idle(stack)


async def test_a_router_fault_is_internal_with_its_own_request_id(faulty, caplog, monkeypatch):
    stack, _ = faulty
    caplog.set_level(logging.ERROR)

    def broken(*args, **kwargs):
        raise KeyError("a router invariant")

    monkeypatch.setattr("router.flow.resolve", broken)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stack.generation, generation_pb2.GenerateRequest(prompt="hi"))
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "router invariant" not in err.value.details()
    (request_id,) = REQUEST_ID.findall(err.value.details())
    assert "log has the details" in err.value.details()
    assert isinstance(_logged_ids(caplog)[request_id].exc_info[1], KeyError)


async def test_a_bad_request_is_invalid_argument_naming_the_field(faulty):
    stack, base_url = faulty
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt="hi", max_new_tokens=0, policy=POLICY))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("max_new_tokens must be in")
    async with httpx2.AsyncClient(base_url=base_url) as http:
        response = await http.post("/chat/completions", json={
            "model": stack.router.model.name, "max_tokens": 4,
            "messages": [{"role": "robot", "content": "hi"}]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "messages[0]" and "role" in error["message"]


async def test_a_request_the_server_was_not_started_for_is_412_with_its_message(faulty):
    stack, base_url = faulty  # its prefill worker has no draft model
    async with httpx2.AsyncClient(base_url=base_url) as http:
        response = await http.post("/completions", json={
            "model": stack.router.model.name, "prompt": "a document " * 8, "max_tokens": 2,
            "snapstream": {"speculative": {"keep": 0.5}}})
    assert response.status_code == 412, response.text
    error = response.json()["error"]
    assert error["code"] == "failed_precondition" and "--draft-model" in error["message"]
    await wait_idle(stack)
