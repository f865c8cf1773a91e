"""Server bootstrap shared by router, prefill and decode: gRPC health (NOT_SERVING until warm),
optional reflection, the status interceptor, Prometheus /metrics, and a graceful drain on
SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from snapstream.serving.errors import StatusInterceptor

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 * 2**20
CHANNEL_OPTIONS = (("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES))


@dataclass(frozen=True)
class ServerSpec:
    name: str  # e.g. "router", printed in logs
    host: str
    port: int
    metrics_port: int
    drain_timeout_s: float
    service_names: tuple[str, ...]  # full names, e.g. "snapstream.v1.Generation"
    reflection: bool = False


async def serve(
    spec: ServerSpec,
    register: Callable[[grpc.aio.Server], None],
    warmup: Callable[[], Awaitable[None]],
    drain: Callable[[float], Awaitable[None]],
) -> None:
    """Runs until SIGTERM/SIGINT, then stops taking work and lets ``drain`` finish what runs."""
    server = grpc.aio.server(interceptors=[StatusInterceptor()], options=CHANNEL_OPTIONS)
    register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = ("", *spec.service_names)
    for name in names:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    if spec.reflection:
        reflection.enable_server_reflection(
            (*spec.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(f"{spec.host}:{spec.port}")
    await server.start()
    if spec.metrics_port:
        prometheus_client.start_http_server(spec.metrics_port, addr=spec.host)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await warmup()
    for name in names:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    print(f"snapstream {spec.name} serving on {spec.host}:{port}", file=sys.stderr, flush=True)
    await stop.wait()
    log.info("%s draining for up to %.0f s", spec.name, spec.drain_timeout_s)
    await health_servicer.enter_graceful_shutdown()
    await drain(spec.drain_timeout_s)
    await server.stop(grace=1.0)


async def wait_until_idle(is_busy: Callable[[], bool], timeout_s: float) -> None:
    """Polls ``is_busy`` until it is false or ``timeout_s`` has passed (draining)."""
    deadline = time.monotonic() + timeout_s
    while is_busy() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def run(coro: Awaitable[None]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(coro)
    return 0
