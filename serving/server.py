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

from kvstore.stores.errors import StoreError
from serving.auth import ApiKeyInterceptor, ApiKeys
from serving.errors import StatusInterceptor
from serving.tls import TlsFiles

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 * 2**20
MESSAGE_OPTIONS = (("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES))
# Between services: a channel whose server died backs off its reconnects (gRPC's default grows
# 1 s x 1.6 per failure up to 120 s) and fails calls at once meanwhile, so a worker restarted
# in seconds stayed unusable for tens; retry at most every second instead.
CHANNEL_OPTIONS = (*MESSAGE_OPTIONS, ("grpc.initial_reconnect_backoff_ms", 250),
                   ("grpc.min_reconnect_backoff_ms", 250), ("grpc.max_reconnect_backoff_ms", 1000))
# gRPC binds with SO_REUSEPORT by default: a second server on a port in use would start and
# take half of the new connections; without it, binding a port in use fails
SERVER_OPTIONS = (*MESSAGE_OPTIONS, ("grpc.so_reuseport", 0))
HEALTH_INTERVAL_S = 0.5


class StartupError(Exception):
    """The service cannot start (a port in use, a store it cannot reach): one line, exit 1."""


@dataclass(frozen=True)
class ServerSpec:
    name: str  # e.g. "router", printed in logs
    host: str
    port: int
    metrics_port: int
    drain_timeout_s: float
    service_names: tuple[str, ...]  # full names, e.g. "snapstream.v1.Generation"
    reflection: bool = False
    tls: TlsFiles | None = None  # None: plaintext
    require_client_cert: bool = False  # mutual TLS (the internal services)
    api_keys: ApiKeys | None = None  # None: no key asked (the internal services)


async def serve(
    spec: ServerSpec,
    register: Callable[[grpc.aio.Server], None],
    warmup: Callable[[], Awaitable[None]],
    drain: Callable[[float], Awaitable[None]],
    can_serve: Callable[[], bool] | None = None,
) -> None:
    """Runs until SIGTERM/SIGINT, then stops taking work and lets ``drain`` finish what runs.
    Health says SERVING once ``warmup`` is done. With ``can_serve``, the named services say so
    only while it does (a router that reaches no worker of a kind), checked every
    HEALTH_INTERVAL_S; the server's overall status ("", what liveness probes ask) stays
    SERVING, so that a router is not restarted for its workers' absence."""
    auth = [] if spec.api_keys is None else [ApiKeyInterceptor(spec.api_keys)]
    server = grpc.aio.server(interceptors=[*auth, StatusInterceptor(spec.name)],
                             options=SERVER_OPTIONS)
    register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = ("", *spec.service_names)
    for name in names:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    if spec.reflection:
        reflection.enable_server_reflection(
            (*spec.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = _bind(server, spec)
    await server.start()
    try:
        if spec.metrics_port:
            try:
                prometheus_client.start_http_server(spec.metrics_port, addr=spec.host)
            except OSError as exc:
                raise StartupError(f"cannot serve metrics on {spec.host}:{spec.metrics_port} "
                                   f"({exc.strerror}); choose another --metrics-port (0: none)"
                                   ) from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await warmup()
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        follower = asyncio.create_task(_follow(health_servicer, spec.service_names,
                                               can_serve or _always))
        print(f"snapstream {spec.name} serving on {spec.host}:{port} ({_security(spec)})",
              file=sys.stderr, flush=True)
    except BaseException:  # a failed start still closes the listener on this loop
        await server.stop(grace=None)
        raise
    await stop.wait()
    log.info("%s draining for up to %.0f s", spec.name, spec.drain_timeout_s)
    follower.cancel()
    await health_servicer.enter_graceful_shutdown()
    await drain(spec.drain_timeout_s)
    await server.stop(grace=1.0)


def _always() -> bool:
    return True


async def _follow(health_servicer: health.aio.HealthServicer, names: tuple[str, ...],
                  can_serve: Callable[[], bool]) -> None:
    """Sets every health name SERVING or NOT_SERVING as ``can_serve`` says, on each change."""
    serving = None
    while True:
        now = can_serve()
        if now != serving:
            status = (health_pb2.HealthCheckResponse.SERVING if now
                      else health_pb2.HealthCheckResponse.NOT_SERVING)
            for name in names:
                await health_servicer.set(name, status)
            if serving is not None:
                log.warning("health: %s", health_pb2.HealthCheckResponse.ServingStatus.Name(status))
            serving = now
        await asyncio.sleep(HEALTH_INTERVAL_S)


def _security(spec: ServerSpec) -> str:
    transport = "plaintext" if spec.tls is None else (
        "mutual TLS" if spec.require_client_cert else "TLS")
    return transport if spec.api_keys is None else f"{transport}, API keys"


def _bind(server: grpc.aio.Server, spec: ServerSpec) -> int:
    address = f"{spec.host}:{spec.port}"
    try:
        if spec.tls is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address,
                                      spec.tls.server_credentials(spec.require_client_cert))
    except RuntimeError:
        raise StartupError(f"cannot listen on {address}: the port is in use (or the address "
                           f"is not this host's); stop the other server or choose another "
                           f"--port") from None


async def wait_until_idle(is_busy: Callable[[], bool], timeout_s: float) -> None:
    """Polls ``is_busy`` until it is false or ``timeout_s`` has passed (draining)."""
    deadline = time.monotonic() + timeout_s
    while is_busy() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def run(coro: Awaitable[None]) -> int:
    """Runs a service; a failure to start is one line on stderr and exit code 1."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        asyncio.run(coro)
    except (StartupError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0
