"""`snapstream serve` as a process: it listens on 127.0.0.1 unless told otherwise, refuses a
port in use, and a store it cannot use, a missing cluster secret, a setting the store cannot
hold or a draft model it cannot load are one line on stderr at start, not a traceback nor a
failure of every request."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis.asyncio

from serving.worker import SECRET_ENV
from tests.integration.conftest import start_server

START_TIMEOUT_S = 120
SECRET = {SECRET_ENV: "a cluster secret for the tests"}


def _serve(*args: str, env: dict[str, str] = SECRET) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSTREAM_")}
    return subprocess.run([sys.executable, "-m", "cli.main", "serve", *args],
                          capture_output=True, text=True, timeout=START_TIMEOUT_S,
                          env={**environ, **env})


def _error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_services_listen_on_loopback_by_default() -> None:
    import argparse

    from decode_svc.main import register

    parser = argparse.ArgumentParser()
    register(parser)
    assert parser.parse_args([]).host == "127.0.0.1"


def test_a_port_in_use_is_refused(tiny_model_dir: Path, redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve("decode", "--model", str(tiny_model_dir), "--store", redis_url,
                        "--port", str(port), "--metrics-port", "0")
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in _error_line(result)


def test_an_http_port_in_use_is_refused(tiny_model_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve("router", "--model", str(tiny_model_dir), "--port", "0",
                        "--metrics-port", "0", "--http-port", str(port))
    assert f"cannot serve the OpenAI API on 127.0.0.1:{port}" in _error_line(result)


@pytest.mark.parametrize(("kind", "wrong", "complaint"), [
    ("redis-password", ":s3cret@", "invalid username-password pair"),
    ("nats-password", ":s3cret@", "Authorization Violation': check the user and password"),
])
def test_a_store_password_that_is_wrong_is_one_line(tiny_model_dir: Path, tmp_path: Path,
                                                    kind: str, wrong: str,
                                                    complaint: str) -> None:
    server = start_server(kind, tmp_path)
    try:
        url = server.url.replace(wrong, ":wrong@")
        result = _serve("prefill", "--model", str(tiny_model_dir), "--store", url, "--port",
                        "0", "--metrics-port", "0")
    finally:
        server.stop()
    line = _error_line(result)
    assert complaint in line and "wrong" not in line  # the password stays masked


def test_a_worker_without_the_cluster_secret_is_refused(tiny_model_dir: Path,
                                                         redis_url: str) -> None:
    result = _serve("decode", "--model", str(tiny_model_dir), "--store", redis_url, "--port",
                    "0", "--metrics-port", "0", env={})
    assert "no cluster secret" in _error_line(result)


def test_a_ttl_beyond_the_stores_is_refused_at_start(tiny_model_dir: Path,
                                                     nats_url: str) -> None:
    result = _serve("prefill", "--model", str(tiny_model_dir), "--store", nats_url, "--port",
                    "0", "--metrics-port", "0", env={**SECRET,
                                                     "SNAPSTREAM_PREFIX_CACHE_TTL_S": "7200"})
    line = _error_line(result)
    assert "--prefix-cache-ttl-s 7200 exceeds the longest TTL" in line
    assert "lower --prefix-cache-ttl-s to at most 3600" in line


def test_a_document_cache_beyond_the_stores_memory_is_refused_at_start(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    server = start_server("redis", tmp_path)

    async def limit() -> None:
        async with redis.asyncio.from_url(server.url) as admin:
            await admin.config_set("maxmemory", str(64 << 20))

    try:
        asyncio.run(limit())
        result = _serve("prefill", "--model", str(tiny_model_dir), "--store", server.url,
                        "--port", "0", "--metrics-port", "0")
    finally:
        server.stop()
    assert "--prefix-cache-max-bytes 1073741824 plus one request's blob" in _error_line(result)


def test_a_draft_model_that_does_not_load_is_refused_before_the_target(
        tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> None:
    result = _serve("prefill", "--model", str(tiny_model_dir), "--store", redis_url, "--port",
                    "0", "--metrics-port", "0", "--draft-model", str(tmp_path / "nothing"))
    assert "--draft-model" in _error_line(result) and "nothing" in _error_line(result)
