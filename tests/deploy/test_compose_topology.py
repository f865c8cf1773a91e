"""End to end: deploy/docker-compose.yml started as local processes (no Docker engine here),
with its commands and environment, on a tiny random model; requests go through the router.

A compose file that would not start, or whose environment a service does not understand,
fails here: every service parses its environment as the container would.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import urllib.request
from pathlib import Path

import grpc
import pytest
import torch

from snapstream.v1 import generation_pb2, generation_pb2_grpc
from tests.deploy.compose import load_compose
from tests.deploy.topology import Instance, Topology, plan, up
from tests.tiny_models import (
    ENDOFTEXT_ID,
    EOS_ID,
    random_model,
    tiny_config,
    write_hf_dir,
)

pytestmark = pytest.mark.slow
STORES = {"redis": {}, "nats": {"STORE_URL": "nats://snapstream:snapstream-dev@nats:4222"}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny random model that never emits EOS, so every stream runs to max_new_tokens."""
    model = random_model(tiny_config(max_position_embeddings=1024))
    with torch.no_grad():
        model.lm_head.weight[[EOS_ID, ENDOFTEXT_ID]] = 0.0
    return write_hf_dir(tmp_path_factory.mktemp("model"), model)


# redis: a decode worker dies mid-stream (SIGKILL); nats: one is stopped (SIGTERM) and drains
@pytest.mark.parametrize(("store", "stop_signal"),
                         [("redis", signal.SIGKILL), ("nats", signal.SIGTERM)],
                         ids=["redis-decode-killed", "nats-decode-stopped"])
def test_compose_topology_serves_through_the_router(store, stop_signal, model_dir, tmp_path):
    compose = load_compose(STORES[store])
    # OMP_NUM_THREADS=1: six processes share this machine's cores
    topology = plan(compose, tmp_path, {"SNAPSTREAM_MODEL": str(model_dir),
                                        "OMP_NUM_THREADS": "1"})
    assert [len(level) for level in topology.levels] == [2, 3, 1]  # stores, workers, router
    with up(topology):
        router = topology.of("router")[0]
        with grpc.insecure_channel(router.address(50051)) as channel:
            stub = generation_pb2_grpc.GenerationStub(channel)
            check_info(stub, model_dir)
            check_streamed_generation(stub)
            check_bad_request(stub)
            check_openai_api(router.address(8000), model_dir)
            check_both_decode_replicas_serve(stub, topology)
            victim = check_stream_survives_its_decode_worker(stub, topology, stop_signal)
        metrics = scrape(router.address(9101))
        assert re.search(r'snapstream_requests_total\{api="grpc",outcome="ok",'
                         r'service="router"\} [1-9]', metrics)
        failovers = 1 if stop_signal == signal.SIGKILL else 0  # a drained stream ends in place
        assert f"snapstream_decode_failovers_total {failovers}.0" in metrics
    assert topology.strays == []
    ours = {i.name: topology.exit_codes[i.name] for i in topology.instances
            if i.kind == "snapstream" and not (i is victim and stop_signal == signal.SIGKILL)}
    assert ours == dict.fromkeys(ours, 0), "on SIGTERM a service drains and exits 0"


def check_info(stub, model_dir: Path) -> None:
    info = stub.Info(generation_pb2.InfoRequest(), timeout=10)
    assert info.model_name == model_dir.name and info.vocab_size == 264


def check_streamed_generation(stub) -> None:
    responses = list(stub.Generate(generation_pb2.GenerateRequest(
        prompt="Hello from compose!", max_new_tokens=12), timeout=60))
    *chunks, last = responses
    assert chunks and all(r.HasField("chunk") for r in chunks) and last.HasField("complete")
    tokens = [t for r in chunks for t in r.chunk.token_ids]
    assert len(tokens) == last.complete.completion_tokens == 12
    assert last.complete.prompt_tokens > 0


def check_bad_request(stub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(generation_pb2.GenerateRequest(prompt=""), timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt" in caught.value.details()


def check_openai_api(address: str, model_dir: Path) -> None:
    with urllib.request.urlopen(f"http://{address}/health", timeout=10) as response:
        assert response.status == 200
    body = {"model": model_dir.name, "prompt": "Hello from compose!", "max_tokens": 12}
    request = urllib.request.Request(f"http://{address}/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        completion = json.load(response)
    assert completion["usage"]["completion_tokens"] == 12
    assert completion["choices"][0]["finish_reason"] == "length"


def check_both_decode_replicas_serve(stub, topology: Topology) -> None:
    """Concurrent streams spread over the replicas: the router sees every decode worker."""
    request = generation_pb2.GenerateRequest(prompt="spread " * 20, max_new_tokens=48)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            list(pool.map(lambda _: list(stub.Generate(request, timeout=60)), range(4)))
            served = [blob_gets(scrape(i.address(9103))) for i in topology.of("decode")]
            if all(served):
                return
    pytest.fail(f"blobs fetched per decode replica: {served}")


def blob_gets(metrics: str) -> float:
    match = re.search(r'snapstream_blob_transfer_seconds_count\{op="get"\} (\S+)', metrics)
    return float(match.group(1)) if match else 0.0


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        return response.read().decode()


def check_stream_survives_its_decode_worker(stub, topology: Topology, stop_signal) -> Instance:
    """Stops the decode replica serving a stream: the client still gets every token, identical
    to an uninterrupted run (resumed elsewhere from the same blob, or drained in place)."""
    request = generation_pb2.GenerateRequest(prompt="The quick brown fox", max_new_tokens=400)
    reference = [t for r in stub.Generate(request, timeout=120) for t in r.chunk.token_ids]
    stream = stub.Generate(request, timeout=120)
    received: list[int] = []
    for response in stream:
        received.extend(response.chunk.token_ids)
        if len(received) >= 20:
            break
    (victim,) = [i for i in topology.of("decode")
                 if 'snapstream_running_requests{service="decode"} 1.0' in
                 scrape(i.address(9103))]
    os.killpg(victim.process.pid, stop_signal)
    rest = list(stream)
    received.extend(t for r in rest for t in r.chunk.token_ids)
    assert rest[-1].complete.completion_tokens == len(received) == 400
    assert received == reference
    if stop_signal == signal.SIGTERM:
        assert victim.process.wait(timeout=60) == 0
    return victim
