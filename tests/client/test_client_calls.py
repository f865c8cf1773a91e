"""Sync and asyncio clients over real gRPC against an in-process fake router: streaming,
typed errors from status codes, deadlines, cancellation and TLS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cluster.certs import ClusterCerts, make_cluster_certs
from snapstream.client import (
    AsyncSnapstreamClient,
    Cancelled,
    Chunk,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    ResourceExhausted,
    SnapstreamClient,
    TlsConfig,
    Unavailable,
)
from tests.client.fake_router import FakeRouter, serving


@pytest.fixture(scope="module")
def router() -> FakeRouter:
    return FakeRouter()


@pytest.fixture(scope="module")
def address(router: FakeRouter) -> Iterator[str]:
    with serving(router) as address:
        yield address


def test_stream_yields_chunks_and_generate_returns_their_sum(address: str) -> None:
    with SnapstreamClient(address, timeout_s=10) as client:
        stream = client.generate_stream("hello", max_new_tokens=5)
        chunks = list(stream)
        completion = client.generate("hello", max_new_tokens=5)
    assert chunks == [Chunk((104, 101), "he"), Chunk((108, 108), "ll"), Chunk((111,), "o")]
    assert stream.result() == completion
    assert completion.text == "hello" and completion.finish_reason == "length"
    assert completion.time_to_first_token_s == pytest.approx(0.012)


def test_options_reach_the_server_and_unset_ones_stay_unset(router: FakeRouter,
                                                            address: str) -> None:
    with SnapstreamClient(address) as client:
        client.generate([104, 105], temperature=0.0, policy="snapkv", n_topk=32)
    request = router.requests[-1]
    assert list(request.prompt_token_ids.ids) == [104, 105]
    assert request.sampling.HasField("temperature") and not request.sampling.HasField("top_p")
    assert request.policy.n_topk == 32 and not request.policy.HasField("n_recent")


def test_info(address: str) -> None:
    with SnapstreamClient(address) as client:
        info = client.info()
    assert info.model_name == "fake" and info.default_policy.kind == "snapstream"


@pytest.mark.parametrize(("prompt", "error"), [
    ("", InvalidArgument),
    ("abort:RESOURCE_EXHAUSTED", ResourceExhausted),
    ("abort:UNAVAILABLE", Unavailable),
    ("no-complete", Internal),
])
def test_failures_raise_typed_errors_with_the_servers_message(address, prompt, error) -> None:
    with SnapstreamClient(address) as client, pytest.raises(error) as info:
        client.generate(prompt)
    if prompt == "":
        assert info.value.details == "prompt: must not be empty"


def test_deadline_from_the_call_or_the_client(address: str) -> None:
    with SnapstreamClient(address, timeout_s=0.2) as client:
        with pytest.raises(DeadlineExceeded):
            client.generate("sleep")
        with pytest.raises(DeadlineExceeded):
            client.generate("sleep", timeout_s=0.05)
        with pytest.raises(ValueError, match="timeout_s must be > 0"):
            client.generate("x", timeout_s=0)


def test_cancel_ends_the_stream_with_cancelled(address: str) -> None:
    with SnapstreamClient(address) as client:
        stream = client.generate_stream("sleep")
        stream.cancel()
        with pytest.raises(Cancelled):
            next(stream)


def test_no_server_is_unavailable() -> None:
    with SnapstreamClient("127.0.0.1:1", timeout_s=5) as client, pytest.raises(Unavailable):
        client.info()


async def test_async_client_has_the_same_behaviour(address: str) -> None:
    async with AsyncSnapstreamClient(address, timeout_s=10) as client:
        chunks = [chunk async for chunk in client.generate_stream("hello")]
        completion = await client.generate("hello")
        info = await client.info()
        with pytest.raises(InvalidArgument, match="prompt: must not be empty"):
            await client.generate("")
        with pytest.raises(DeadlineExceeded):
            await client.generate("sleep", timeout_s=0.05)
    assert "".join(chunk.text for chunk in chunks) == completion.text == "hello"
    assert info.vocab_size == 264


async def test_async_cancel_ends_the_stream_with_cancelled(address: str) -> None:
    async with AsyncSnapstreamClient(address) as client:
        stream = client.generate_stream("sleep")
        stream.cancel()
        with pytest.raises(Cancelled):
            await anext(stream)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> ClusterCerts:
    """A CA and a certificate it signed for the name snapstream.test."""
    return make_cluster_certs(tmp_path_factory.mktemp("tls"), ("snapstream.test",))


def test_tls_with_mutual_authentication(certificates: ClusterCerts) -> None:
    ca, cert, key = certificates.ca, certificates.cert, certificates.key
    credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())],
                                              root_certificates=ca.read_bytes(),
                                              require_client_auth=True)
    with serving(FakeRouter(), credentials) as address:
        tls = TlsConfig(root_certificates=ca, certificate_chain=cert, private_key=key,
                        server_name_override="snapstream.test")
        with SnapstreamClient(address, tls=tls, timeout_s=10) as client:
            assert client.generate("hi").text == "hi"
        without_client_cert = TlsConfig(root_certificates=ca,
                                        server_name_override="snapstream.test")
        with SnapstreamClient(address, tls=without_client_cert, timeout_s=10) as client, \
                pytest.raises(Unavailable):
            client.generate("hi")


def test_tls_config_needs_certificate_and_key_together(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="certificate_chain and private_key"):
        TlsConfig(certificate_chain=tmp_path / "cert.pem")
