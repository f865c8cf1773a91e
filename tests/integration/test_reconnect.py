"""A service's channel to a worker that died and came back on its port serves again within a
second or so: gRPC's default reconnect backoff (1 s x 1.6 per failure, up to 120 s) left a
restarted decode worker unusable to the router for tens of seconds."""

from __future__ import annotations

import asyncio
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from serving.server import CHANNEL_OPTIONS, SERVER_OPTIONS
from serving.tls import open_channel

DOWN_S = 6.0  # long enough for the default backoff to grow past 5 s


async def _server(port: int) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


async def _check(stub: health_pb2_grpc.HealthStub) -> bool:
    try:
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=0.2)
    except grpc.aio.AioRpcError:
        return False
    return True


async def test_a_restarted_worker_is_reachable_again_within_about_a_second():
    server, port = await _server(0)
    async with open_channel(f"127.0.0.1:{port}", None, CHANNEL_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        assert await _check(stub)
        await server.stop(grace=None)
        down_until = time.monotonic() + DOWN_S
        while time.monotonic() < down_until:  # the router keeps trying the dead worker
            assert not await _check(stub)
            await asyncio.sleep(0.2)
        server, _ = await _server(port)
        try:
            back = time.monotonic()
            while not await _check(stub):
                assert time.monotonic() - back < 2.5, "still backing off"
                await asyncio.sleep(0.05)
        finally:
            await server.stop(grace=None)
