"""`snapstream health`: the container healthcheck, against a real gRPC health server."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cli import main as cli

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, \
    health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, health.HealthServicer]]:
    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(grace=None)


def test_the_command_is_registered():
    assert "health" in cli.COMMANDS, \
        "register cli.health in cli/main.py COMMANDS (compose uses it)"


@pytest.mark.parametrize(("status", "code", "word"),
                         [(SERVING, 0, "SERVING"), (NOT_SERVING, 1, "NOT_SERVING")],
                         ids=["serving", "not-serving"])
def test_exit_code_follows_the_serving_status(server, capsys, status, code, word):
    address, servicer = server
    servicer.set("snapstream.v1.Decode", status)
    assert cli.main(["health", "--addr", address, "--service", "snapstream.v1.Decode"]) == code
    assert capsys.readouterr().out == f"{address} snapstream.v1.Decode: {word}\n"


def test_unknown_service_and_nothing_listening_are_unhealthy(server, capsys):
    address, _ = server
    assert cli.main(["health", "--addr", address, "--service", "no.such.Service"]) == 1
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{sock.getsockname()[1]}"
    assert cli.main(["health", "--addr", closed, "--timeout-s", "0.5"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == f"{closed} (server): UNREACHABLE"


def test_bad_address_is_a_usage_error(capsys):
    assert cli.main(["health", "--addr", "nowhere"]) == 2
    assert "--addr" in capsys.readouterr().err
