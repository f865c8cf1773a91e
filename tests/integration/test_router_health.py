"""`snapstream serve router` as a process says NOT_SERVING (gRPC health of its service, HTTP
/health 503) while it reaches no decode worker, and SERVING once one listens; its overall
health ("", what liveness probes ask) stays SERVING, so that it is not restarted meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc

from cluster.health import health_statuses
from snapstream.v1 import decode_pb2_grpc
from tests.integration.conftest import _free_port
from tests.integration.test_services import serving_stack

START_TIMEOUT_S = 120
GENERATION = "snapstream.v1.Generation"


@contextlib.contextmanager
def router_process(model: Path, prefill: str, decode: str, log: Path
                   ) -> Iterator[tuple[str, int]]:
    """-> (gRPC address, HTTP port) once its overall health says SERVING."""
    port, http_port = _free_port(), _free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "router", "--model", str(model),
             "--port", str(port), "--http-port", str(http_port), "--metrics-port", "0",
             "--prefill-addrs", prefill, "--decode-addrs", decode],
            stdout=out, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while health_statuses(address, ("",))[""] != "SERVING":
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield address, http_port
    finally:
        process.terminate()
        process.wait(timeout=30)


def _http_health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


async def _until(check, expected) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while (seen := await asyncio.to_thread(check)) != expected:
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.1)


async def test_a_router_without_a_decode_worker_is_not_serving_until_one_listens(
        tiny_model_dir, redis_url, tmp_path):
    decode_port = _free_port()
    async with serving_stack(tiny_model_dir, redis_url) as stack:
        (prefill,) = stack.router.prefill.addresses  # the stack's one server
        with router_process(tiny_model_dir, prefill, f"127.0.0.1:{decode_port}",
                            tmp_path / "router.log") as (address, http_port):
            await _until(lambda: health_statuses(address, ("", GENERATION)),
                         {"": "SERVING", GENERATION: "NOT_SERVING"})
            assert await asyncio.to_thread(_http_health, http_port) == 503
            decode = grpc.aio.server()
            decode_pb2_grpc.add_DecodeServicer_to_server(stack.decode_servicer, decode)
            decode.add_insecure_port(f"127.0.0.1:{decode_port}")
            await decode.start()
            try:
                await _until(lambda: health_statuses(address, (GENERATION,)),
                             {GENERATION: "SERVING"})
                assert await asyncio.to_thread(_http_health, http_port) == 200
            finally:
                await decode.stop(grace=None)
