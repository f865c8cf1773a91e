"""`snapstream up --tls --api-key` as processes: every public port speaks TLS and asks for the
key (health open), the router reaches its workers over mutual TLS, and the workers refuse a
caller without a certificate of the cluster's CA."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import grpc
import openai
import pytest

from cluster import ClusterSpec, LocalCluster
from cluster.health import health_statuses
from snapstream.client import SnapstreamClient, TlsConfig, Unauthenticated, Unavailable
from snapstream.v1 import decode_pb2, decode_pb2_grpc

pytestmark = pytest.mark.slow
PROMPT = "behind a lock " * 4


@pytest.fixture(scope="module")
def cluster(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[LocalCluster]:
    spec = ClusterSpec(model=tiny_model, router_port=0, decode_workers=1, rows=2, tls=True,
                       api_key=True, log_dir=tmp_path_factory.mktemp("secure"))
    with LocalCluster(spec) as started:
        yield started


def test_the_sdk_needs_the_ca_and_the_key(cluster: LocalCluster, monkeypatch) -> None:
    monkeypatch.delenv("SNAPSTREAM_API_KEY", raising=False)
    assert cluster.api_key_file.stat().st_mode & 0o777 == 0o600
    router, tls = cluster.endpoints["router"], TlsConfig(root_certificates=cluster.ca_file)
    with SnapstreamClient(router, tls=tls, timeout_s=60, api_key=cluster.api_key) as client:
        assert client.generate(PROMPT, max_new_tokens=4).completion_tokens == 4
    with SnapstreamClient(router, tls=tls, timeout_s=60) as client, \
            pytest.raises(Unauthenticated, match="an API key is required"):
        client.generate(PROMPT, max_new_tokens=4)
    with SnapstreamClient(router, timeout_s=10, api_key=cluster.api_key) as client, \
            pytest.raises(Unavailable):  # plaintext to a TLS port
        client.generate(PROMPT, max_new_tokens=4)
    assert health_statuses(router, ("",), tls=tls) == {"": "SERVING"}  # no key, no certificate


def test_workers_take_only_callers_with_a_cluster_certificate(cluster: LocalCluster) -> None:
    decode = cluster.endpoints["decode-0"]
    server_only = TlsConfig(root_certificates=cluster.ca_file)
    assert health_statuses(decode, ("",), tls=server_only) == {"": "UNREACHABLE"}
    assert health_statuses(decode, ("",), tls=cluster.client_tls) == {"": "SERVING"}
    with grpc.secure_channel(decode, server_only.credentials()) as channel, \
            pytest.raises(grpc.RpcError) as refused:
        decode_pb2_grpc.DecodeStub(channel).Stats(decode_pb2.StatsRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_openai_api_is_https_with_the_key(cluster: LocalCluster) -> None:
    assert cluster.openai_url.startswith("https://")
    verify = ssl.create_default_context(cafile=cluster.ca_file)

    def client(key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=cluster.openai_url, api_key=key, max_retries=0,
                             timeout=60, http_client=openai.DefaultHttpxClient(verify=verify))

    with client(cluster.api_key) as keyed:
        (model,) = [m.id for m in keyed.models.list().data]
        answer = keyed.completions.create(model=model, prompt=PROMPT, max_tokens=3)
    assert answer.usage.completion_tokens == 3
    with client("not-the-key-" + "x" * 16) as wrong, pytest.raises(openai.AuthenticationError):
        wrong.models.list()
