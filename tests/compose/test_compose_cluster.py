"""deploy/compose.sh up: Redis, NATS, the router, a prefill worker and two decode workers in real
containers, the default model answering through the published ports; a decode container killed
mid-stream, one crashed (the restart policy), three decode workers sharing the load; `down`
leaves nothing of the project behind."""

from __future__ import annotations

import concurrent.futures
import subprocess

import openai
import pytest

from snapstream.client import InvalidArgument, SnapstreamClient
from tests.compose.checks import (
    blob_gets,
    check_openai_answers,
    check_sdk_answers,
    check_stream_outlives_its_decode,
    failovers,
)
from tests.compose.cluster import (
    Cluster,
    compose,
    compose_wait,
    containers,
    inspect,
    metrics,
    project_leftovers,
    run,
)

pytestmark = pytest.mark.compose


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster.up()  # the Redis store
    yield cluster
    Cluster.down()


@pytest.fixture
def client(cluster):
    with SnapstreamClient(cluster.addr, timeout_s=300) as client:
        yield client


def test_two_decode_one_prefill_every_container_healthy(cluster):
    assert cluster.openai_base_url.startswith("http://127.0.0.1:")
    for service, count in (("redis", 1), ("nats", 1), ("router", 1), ("prefill", 1),
                           ("decode", 2)):
        ids = containers(service)
        assert len(ids) == count, service
        assert all(inspect(c)["State"]["Health"]["Status"] == "healthy" for c in ids), service


def test_openai_client_gets_the_default_models_answer(cluster):
    check_openai_answers(openai.OpenAI(base_url=cluster.openai_base_url, api_key="unused",
                                       timeout=300))


def test_sdk_gets_the_same_answer_streamed_or_not(client):
    check_sdk_answers(client)
    with pytest.raises(InvalidArgument, match="prompt"):
        client.generate("")


def test_stream_survives_docker_kill_of_its_decode_container(client):
    (router,) = containers("router")
    before = failovers(metrics(router, 9101))
    victim = check_stream_outlives_its_decode(
        client, lambda container: run("docker", "kill", container))
    assert failovers(metrics(router, 9101)) == before + 1
    # `docker kill` counts as a manual stop, which no restart policy undoes: start it again
    assert inspect(victim)["State"]["Status"] == "exited"
    run("docker", "start", victim)
    compose_wait()


def test_a_crashed_decode_container_is_restarted(client):
    """The restart policy: the process dies (as under the OOM killer), Docker starts it again
    and it serves once healthy."""
    victim = containers("decode")[0]
    restarts = inspect(victim)["RestartCount"]
    subprocess.run(["kill", "-9", str(inspect(victim)["State"]["Pid"])], check=True)
    compose_wait()
    assert inspect(victim)["RestartCount"] == restarts + 1
    assert client.generate("Hello", max_new_tokens=4, temperature=0.0).completion_tokens == 4


def test_scaled_to_three_decode_workers_every_one_serves(client):
    compose("up", "-d", "--no-recreate", "--scale", "decode=3")
    compose_wait()
    decode = containers("decode")
    assert len(decode) == 3
    before = [blob_gets(metrics(c, 9103)) for c in decode]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        for _ in range(4):
            list(pool.map(lambda _: client.generate("spread " * 20, max_new_tokens=32),
                          range(6)))
            served = [blob_gets(metrics(c, 9103)) - b for c, b in zip(decode, before,
                                                                        strict=True)]
            if all(served):
                break
    assert all(served), f"blobs fetched per decode worker: {served}"
    compose("up", "-d", "--no-recreate", "--scale", "decode=2")
    assert len(containers("decode")) == 2


def test_down_removes_containers_networks_and_volumes(cluster):
    Cluster.down()
    assert project_leftovers() == {"containers": [], "networks": [], "volumes": []}
    images = run("docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}").split()
    assert "snapstream:0.1.0" in images, "images stay for the next run"
