"""Readiness probes: gRPC health (``grpc.health.v1``) of a service, TCP accept of a store."""

from __future__ import annotations

import socket

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from snapstream.client.tls import TlsConfig

UNREACHABLE = "UNREACHABLE"


def health_statuses(address: str, services: tuple[str, ...], timeout_s: float = 1.0,
                    tls: TlsConfig | None = None) -> dict[str, str]:
    """Status name (SERVING, NOT_SERVING, ...) of each health service name at ``address``
    (over TLS when ``tls`` is given); UNREACHABLE when the check fails (nothing listening yet,
    unknown name, a TLS handshake refused)."""
    channel = (grpc.insecure_channel(address) if tls is None else
               grpc.secure_channel(address, tls.credentials(), options=tls.channel_options()))
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return {service: _status(stub, service, timeout_s) for service in services}


def is_accepting(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def _status(stub: health_pb2_grpc.HealthStub, service: str, timeout_s: float) -> str:
    try:
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    except grpc.RpcError:
        return UNREACHABLE
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
