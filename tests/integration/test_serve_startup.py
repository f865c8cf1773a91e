"""`snapstream serve` as a process: it listens on 127.0.0.1 unless told otherwise, refuses a
port in use, and a store it cannot use is one line on stderr, not a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import start_server

START_TIMEOUT_S = 120


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "serve", *args],
                          capture_output=True, text=True, timeout=START_TIMEOUT_S)


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
