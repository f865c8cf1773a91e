"""Mutual TLS on an internal service, as a process: `snapstream serve decode --tls-*` answers a
caller holding a certificate of the cluster's CA, and refuses one without it or in plaintext."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cluster.certs import ClusterCerts, make_cluster_certs
from cluster.health import health_statuses
from serving.tls import TlsFiles, open_channel
from serving.worker import SECRET_ENV
from snapstream.client.tls import TlsConfig
from snapstream.v1 import decode_pb2, decode_pb2_grpc

START_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> ClusterCerts:
    return make_cluster_certs(tmp_path_factory.mktemp("tls"), ("127.0.0.1", "localhost"))


@pytest.fixture(scope="module")
def decode_address(certs: ClusterCerts, tiny_model_dir: Path, redis_url: str,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp_path_factory.mktemp("decode") / "decode.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "decode", "--model",
         str(tiny_model_dir), "--store", redis_url, "--port", str(port), "--metrics-port", "0",
         "--tls-cert", str(certs.cert), "--tls-key", str(certs.key), "--tls-ca", str(certs.ca)],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, SECRET_ENV: "a cluster secret for the tests"})
    address = f"127.0.0.1:{port}"
    client_tls = TlsConfig(root_certificates=certs.ca, certificate_chain=certs.cert,
                           private_key=certs.key)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while health_statuses(address, ("",), tls=client_tls)[""] != "SERVING":
            assert process.poll() is None and time.monotonic() < deadline, log.name
            time.sleep(0.2)
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


async def _stats(channel: grpc.aio.Channel) -> decode_pb2.StatsResponse:
    return await decode_pb2_grpc.DecodeStub(channel).Stats(decode_pb2.StatsRequest(), timeout=10)


async def test_a_caller_with_the_clusters_certificate_is_served(certs, decode_address):
    tls = TlsFiles(cert=certs.cert, key=certs.key, ca=certs.ca)
    async with open_channel(decode_address, tls) as channel:
        assert (await _stats(channel)).total_rows == 8


@pytest.mark.parametrize("caller", ["without-client-certificate", "plaintext"])
async def test_a_caller_without_it_is_refused(certs, decode_address, caller):
    channel = (grpc.aio.insecure_channel(decode_address) if caller == "plaintext" else
               grpc.aio.secure_channel(decode_address, TlsConfig(
                   root_certificates=certs.ca).credentials()))
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _stats(channel)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_health_command_speaks_tls(certs, decode_address):
    from cli.main import main

    flags = ["--tls-ca", str(certs.ca), "--tls-cert", str(certs.cert), "--tls-key",
             str(certs.key)]
    assert main(["health", "--addr", decode_address, *flags]) == 0
    assert main(["health", "--addr", decode_address]) == 1  # plaintext: unreachable
