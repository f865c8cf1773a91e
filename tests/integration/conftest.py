"""Real Redis and NATS servers on free ports, started once per session, and stores on them.

``store`` is parametrized over both back ends; each test gets its own namespace (Redis key
prefix, NATS stream), so tests never see each other's blobs. ``raw`` reads the namespace
through the server's own client, to check the documented layout and what is left behind.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
import pytest
import redis.asyncio

from kvstore import BlobStore, open_store

SERVER_START_TIMEOUT_S = 15.0
BACKENDS = ["redis", "nats"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """A server process on a free port of 127.0.0.1."""

    url: str
    process: subprocess.Popen
    argv: list[str]
    log_path: Path

    def restart(self) -> None:
        """Stop the server and start it again on the same port."""
        self.stop()
        self.process = _launch(self.argv, self.log_path)
        _wait_accepting(self.process, urlsplit(self.url).port, self.log_path)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# kind: (binary, arguments for (port, workdir), URL template)
SERVER_KINDS: dict[str, tuple[str, Callable[[int, Path], list[str]], str]] = {
    "redis": ("redis-server",
              lambda port, workdir: ["--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                     "--appendonly", "no", "--dir", str(workdir)],
              "redis://127.0.0.1:{port}/0"),
    "redis-password": ("redis-server",
                       lambda port, workdir: ["--port", str(port), "--bind", "127.0.0.1",
                                              "--save", "", "--appendonly", "no",
                                              "--dir", str(workdir), "--requirepass", "s3cret"],
                       "redis://:s3cret@127.0.0.1:{port}/0"),
    "nats": ("nats-server",
             lambda port, workdir: ["-js", "-a", "127.0.0.1", "-p", str(port),
                                    "-sd", str(workdir / "jetstream")],
             "nats://127.0.0.1:{port}"),
    "nats-password": ("nats-server",
                      lambda port, workdir: ["-js", "-a", "127.0.0.1", "-p", str(port),
                                             "-sd", str(workdir / "jetstream"),
                                             "--user", "snap", "--pass", "s3cret"],
                      "nats://snap:s3cret@127.0.0.1:{port}"),
    "nats-token": ("nats-server",
                   lambda port, workdir: ["-js", "-a", "127.0.0.1", "-p", str(port),
                                          "-sd", str(workdir / "jetstream"), "--auth", "t0ken"],
                   "nats://t0ken@127.0.0.1:{port}"),
    "redis-tls": ("redis-server",
                  lambda port, workdir: ["--port", "0", "--tls-port", str(port), "--bind",
                                         "127.0.0.1", "--save", "", "--appendonly", "no",
                                         "--dir", str(workdir), "--requirepass", "s3cret",
                                         *_tls_flags(workdir, "--tls-cert-file", "--tls-key-file"),
                                         "--tls-auth-clients", "no"],
                  "rediss://:s3cret@127.0.0.1:{port}/0?tls_ca_file={workdir}/tls/ca.pem"),
    "nats-tls": ("nats-server",
                 lambda port, workdir: ["-js", "-a", "127.0.0.1", "-p", str(port),
                                        "-sd", str(workdir / "jetstream"), "--user", "snap",
                                        "--pass", "s3cret", "--tls",
                                        *_tls_flags(workdir, "--tlscert", "--tlskey")],
                 "tls://snap:s3cret@127.0.0.1:{port}?tls_ca_file={workdir}/tls/ca.pem"),
    "nats-without-jetstream": ("nats-server",
                               lambda port, workdir: ["-a", "127.0.0.1", "-p", str(port)],
                               "nats://127.0.0.1:{port}"),
}


def _tls_flags(workdir: Path, cert_flag: str, key_flag: str) -> list[str]:
    """A CA and a server certificate for 127.0.0.1 in ``workdir/tls``."""
    from cluster.certs import make_cluster_certs

    certs = make_cluster_certs(workdir / "tls", ("127.0.0.1", "localhost"))
    return [cert_flag, str(certs.cert), key_flag, str(certs.key)]


def start_server(kind: str, workdir: Path) -> Server:
    """Start a server and wait until it accepts connections; fail the test clearly if not."""
    name, arguments, url = SERVER_KINDS[kind]
    binary = shutil.which(name)
    if binary is None:
        pytest.fail(f"{name} is not on PATH; the integration tests need a real server "
                    f"(scripts/setup.sh installs it)", pytrace=False)
    port, log_path = _free_port(), workdir / "server.log"
    argv = [binary, *arguments(port, workdir)]
    process = _launch(argv, log_path)
    _wait_accepting(process, port, log_path)
    return Server(url.format(port=port, workdir=workdir), process, argv, log_path)


def _launch(argv: list[str], log_path: Path) -> subprocess.Popen:
    with log_path.open("ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def _wait_accepting(process: subprocess.Popen, port: int, log_path: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{process.args[0]} exited with {process.returncode}:\n"
                        f"{log_path.read_text()}", pytrace=False)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    process.kill()
    pytest.fail(f"{process.args[0]} did not accept connections on port {port} within "
                f"{SERVER_START_TIMEOUT_S} s:\n{log_path.read_text()}", pytrace=False)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = start_server("redis", tmp_path_factory.mktemp("redis"))
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = start_server("nats", tmp_path_factory.mktemp("nats"))
    yield server.url
    server.stop()


@pytest.fixture
def own_server(backend: str, tmp_path: Path) -> Iterator[Server]:
    """A server of the test's back end for this test alone (it may stop it)."""
    server = start_server(backend, tmp_path)
    yield server
    server.stop()


@pytest.fixture
def plain_nats_url(tmp_path: Path) -> Iterator[str]:
    server = start_server("nats-without-jetstream", tmp_path)
    yield server.url
    server.stop()


@pytest.fixture
def unused_port() -> int:
    return _free_port()


def _namespace_options(backend: str, **overrides: Any) -> dict[str, Any]:
    name = f"t{uuid.uuid4().hex[:12]}"
    base = {"prefix": name} if backend == "redis" else {"stream": name, "subject_prefix": name}
    return base | overrides


@pytest.fixture
def new_namespace() -> Callable[..., dict[str, Any]]:
    """new_namespace(backend, **overrides): store options for a fresh namespace of the server."""
    return _namespace_options


@dataclass
class Raw:
    """One store's namespace, read and written through the server's own client."""

    backend: str
    url: str
    options: dict[str, Any]

    def manifest_name(self, key: str) -> str:
        if self.backend == "redis":
            return f"{self.options['prefix']}:blob:{key}"
        return f"{self.options['subject_prefix']}.m.{key}"

    def chunk_name(self, key: str, put_id: str, index: int) -> str:
        if self.backend == "redis":
            return f"{self.options['prefix']}:chunk:{key}:{put_id}:{index}"
        return f"{self.options['subject_prefix']}.c.{key}.{put_id}.{index}"

    async def names(self) -> list[str]:
        """Every key (Redis) or subject with a message (NATS) in the namespace."""
        if self.backend == "redis":
            async with redis.asyncio.from_url(self.url) as client:
                return sorted([name.decode() async for name in self._redis_names(client)])
        async with _nats_client(self.url) as client:
            info = await client.jetstream().stream_info(self.options["stream"],
                                                        subjects_filter=">")
            return sorted(info.state.subjects or {})

    async def get(self, name: str) -> bytes | None:
        if self.backend == "redis":
            async with redis.asyncio.from_url(self.url) as client:
                return await client.get(name)
        async with _nats_client(self.url) as client:
            message = await client.jetstream().get_last_msg(self.options["stream"], name)
            return message.data

    async def set(self, name: str, data: bytes) -> None:
        """Overwrite a key or subject in place (Redis keeps the key's TTL)."""
        if self.backend == "redis":
            async with redis.asyncio.from_url(self.url) as client:
                await client.set(name, data, keepttl=True)
            return
        async with _nats_client(self.url) as client:
            await client.jetstream().publish(name, data)

    async def delete(self, name: str) -> None:
        """Remove one key or subject, as its expiry would."""
        if self.backend == "redis":
            async with redis.asyncio.from_url(self.url) as client:
                await client.delete(name)
            return
        async with _nats_client(self.url) as client:
            await client.jetstream().purge_stream(self.options["stream"], subject=name)

    async def drop(self) -> None:
        """Remove the namespace from the shared server."""
        if self.backend == "redis":
            async with redis.asyncio.from_url(self.url) as client:
                names = [name async for name in self._redis_names(client)]
                if names:
                    await client.delete(*names)
            return
        async with _nats_client(self.url) as client:
            await client.jetstream().delete_stream(self.options["stream"])

    def _redis_names(self, client: redis.asyncio.Redis) -> AsyncIterator[bytes]:
        return client.scan_iter(match=f"{self.options['prefix']}:*")


@contextlib.asynccontextmanager
async def _nats_client(url: str) -> AsyncIterator[nats.NATS]:
    client = await nats.connect(url)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def url(backend: str, request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue(f"{backend}_url")


@pytest.fixture
def store_options(backend: str) -> dict[str, Any]:
    return _namespace_options(backend)


@pytest.fixture
def raw(backend: str, url: str, store_options: dict[str, Any]) -> Raw:
    return Raw(backend, url, store_options)


@pytest.fixture
async def store(url: str, store_options: dict[str, Any], raw: Raw) -> AsyncIterator[BlobStore]:
    async with await open_store(url, **store_options) as opened:
        yield opened
    await raw.drop()
