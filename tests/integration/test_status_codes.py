"""Status codes the shared server plumbing gives, over real gRPC: a body that does not parse is
INVALID_ARGUMENT (not UNKNOWN), an RPC a servicer lacks is UNIMPLEMENTED (not INTERNAL)."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from serving.errors import StatusInterceptor
from tests.integration.test_services import serving_stack

# GenerateRequest.prompt (field 1, a string) holding invalid UTF-8; then a truncated length
BAD_BODIES = {"invalid-utf8-prompt": b"\x0a\x02\xff\xfe",
              "invalid-utf8-stop": b"\x22\x04\x2a\x02\xc3\x28",
              "truncated": b"\x0a\x09abc"}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
async def test_a_body_that_does_not_parse_is_invalid_argument(tiny_model_dir, redis_url, body):
    async with serving_stack(tiny_model_dir, redis_url) as stack:
        call = stack.channel.unary_stream("/snapstream.v1.Generation/Generate")(body)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not parse" in err.value.details()


async def test_health_list_is_unimplemented():
    server = grpc.aio.server(interceptors=[StatusInterceptor()])
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            if not hasattr(stub, "List"):
                pytest.skip("this grpcio-health-checking has no Health/List")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.List(health_pb2.HealthListRequest())
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(grace=None)
