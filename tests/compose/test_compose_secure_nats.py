"""deploy/compose.sh up --store nats --secure: the KV cache blobs through NATS JetStream, TLS on
every service and an API key on the router (deploy/docker-compose.secure.yml, the compose twin
of the Kubernetes components tls and api-keys); a decode container stopped mid-stream drains
it in place."""

from __future__ import annotations

import json
import ssl

import httpx2
import openai
import pytest

from snapstream.client import SnapstreamClient, Unauthenticated, Unavailable
from snapstream.client.tls import TlsConfig
from tests.compose.checks import (
    check_openai_answers,
    check_sdk_answers,
    check_stream_outlives_its_decode,
    failovers,
)
from tests.compose.cluster import Cluster, containers, inspect, metrics, project_leftovers, run

pytestmark = pytest.mark.compose


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster.up("--store", "nats", "--secure")
    yield cluster
    Cluster.down()


@pytest.fixture
def client(cluster):
    tls = TlsConfig(root_certificates=cluster.ca)
    with SnapstreamClient(cluster.addr, tls=tls, api_key=cluster.api_key,
                          timeout_s=300) as client:
        yield client


def test_openai_client_over_https_with_the_key(cluster):
    assert cluster.openai_base_url.startswith("https://127.0.0.1:")
    with httpx2.Client(verify=ssl.create_default_context(cafile=cluster.ca)) as http:
        check_openai_answers(openai.OpenAI(base_url=cluster.openai_base_url,
                                           api_key=cluster.api_key, http_client=http,
                                           timeout=300))
        keyless = openai.OpenAI(base_url=cluster.openai_base_url, api_key="not-the-key-at-all",
                                http_client=http, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            keyless.models.list()


def test_sdk_over_tls_with_the_key(cluster, client):
    check_sdk_answers(client)
    tls = TlsConfig(root_certificates=cluster.ca)
    with SnapstreamClient(cluster.addr, tls=tls, api_key="", timeout_s=30) as keyless, \
            pytest.raises(Unauthenticated):
        keyless.info()
    with SnapstreamClient(cluster.addr, api_key=cluster.api_key, timeout_s=30) as plaintext, \
            pytest.raises(Unavailable):
        plaintext.info()


def test_internal_services_refuse_callers_without_a_certificate(cluster):
    """Mutual TLS inside: prefill asks every caller for a certificate signed by the CA."""
    (prefill,) = containers("prefill")
    probe = ("import grpc, sys\n"
             "ca = open('/tls/ca.crt', 'rb').read()\n"
             "creds = grpc.ssl_channel_credentials(root_certificates=ca)\n"
             "channel = grpc.secure_channel('127.0.0.1:50052', creds, options=(("
             "'grpc.ssl_target_name_override', 'snapstream-internal'),))\n"
             "try:\n"
             "    grpc.channel_ready_future(channel).result(timeout=10)\n"
             "except grpc.FutureTimeoutError:\n"
             "    print('refused')\n")
    assert run("docker", "exec", prefill, "python", "-c", probe).strip() == "refused"


def test_blobs_travel_through_nats_jetstream(client):
    client.generate("Hello through NATS", max_new_tokens=4, temperature=0.0)
    (nats,) = containers("nats")
    jsz = json.loads(run("docker", "exec", nats, "wget", "-qO-",
                         "http://127.0.0.1:8222/jsz?streams=true"))
    streams = {s["name"]: s["state"] for account in jsz["account_details"]
               for s in account.get("stream_detail", [])}
    assert streams["SNAPSTREAM_BLOBS"]["last_seq"] >= 1


def test_stopped_decode_container_drains_its_stream_in_place(client):
    (router,) = containers("router")
    before = failovers(metrics(router, 9101))
    victim = check_stream_outlives_its_decode(
        client, lambda container: run("docker", "stop", "--time", "40", container))
    state = inspect(victim)["State"]
    assert (state["Status"], state["ExitCode"]) == ("exited", 0), "SIGTERM: drain, exit 0"
    assert failovers(metrics(router, 9101)) == before, "the stream ended where it ran"


def test_down_leaves_nothing(cluster):
    Cluster.down()
    assert project_leftovers() == {"containers": [], "networks": [], "volumes": []}

