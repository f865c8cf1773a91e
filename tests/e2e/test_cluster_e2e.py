"""The system as processes: store server, router, one prefill and two decode workers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from cluster import ClusterSpec, LocalCluster
from kvstore import open_store
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.v1 import (
    common_pb2,
    decode_pb2,
    decode_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
)

pytestmark = pytest.mark.slow
POLICY = common_pb2.CachePolicy(kind=common_pb2.POLICY_KIND_SNAPSTREAM, n_sink=4, n_topk=24,
                                n_recent=16, observation=8)
ENGINE_POLICY = CachePolicy(n_sink=4, n_topk=24, n_recent=16, observation=8)
PROMPTS = [f"request {i}: " + "lorem ipsum dolor " * (3 + 7 * i) for i in range(6)]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> Path:
    return tiny_model_dir


@pytest.fixture(scope="module")
def engine(model_dir) -> Engine:
    return Engine.from_pretrained(model_dir)


@pytest.fixture(scope="module", params=["redis", "nats"])
def cluster(request, model_dir, tmp_path_factory):
    spec = ClusterSpec(store=request.param, model=model_dir, router_port=0, rows=4,
                       drain_timeout_s=5.0, log_dir=tmp_path_factory.mktemp("cluster-logs"))
    with LocalCluster(spec) as running:
        yield running
        assert not running.exited(), "a member crashed"


def _request(prompt: str, max_new_tokens: int) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(prompt=prompt, max_new_tokens=max_new_tokens,
                                          policy=POLICY)


async def _stream(address: str, request, on_token=None) -> list[int]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        tokens: list[int] = []
        async for response in stub.Generate(request):
            for token in response.chunk.token_ids:
                tokens.append(token)
                if on_token is not None:
                    await on_token(len(tokens))
        return tokens


async def _decode_stats(cluster: LocalCluster) -> dict[str, decode_pb2.StatsResponse]:
    stats = {}
    for name, address in cluster.endpoints.items():
        if name.startswith("decode") and name in cluster.running:
            async with grpc.aio.insecure_channel(address) as channel:
                stub = decode_pb2_grpc.DecodeStub(channel)
                stats[name] = await stub.Stats(decode_pb2.StatsRequest(), timeout=5)
    return stats


async def _assert_nothing_left(cluster: LocalCluster) -> None:
    store = await open_store(cluster.endpoints["store"])
    try:
        for _ in range(100):
            stats = await _decode_stats(cluster)
            busy = {n: s.running for n, s in stats.items() if s.running or s.queue_depth}
            keys = await store.keys()
            if not busy and not keys:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"left behind: busy rows {busy}, blobs {keys}")
    finally:
        await store.close()


async def test_concurrent_streams_equal_the_in_process_engine(cluster, engine):
    router = cluster.endpoints["router"]
    results = await asyncio.gather(*(_stream(router, _request(p, 40)) for p in PROMPTS))
    for prompt, tokens in zip(PROMPTS, results, strict=True):
        assert tokens == engine.generate(prompt, 40, policy=ENGINE_POLICY).token_ids
    await _assert_nothing_left(cluster)


async def test_bad_request_is_invalid_argument_with_a_message(cluster):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _stream(cluster.endpoints["router"], generation_pb2.GenerateRequest(
            prompt="hello", policy=common_pb2.CachePolicy(n_recent=0, n_sink=1, n_topk=1)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "n_recent" in err.value.details()


async def test_cancelled_stream_leaves_no_blob_and_no_busy_row(cluster):
    async with grpc.aio.insecure_channel(cluster.endpoints["router"]) as channel:
        call = generation_pb2_grpc.GenerationStub(channel).Generate(
            _request("cancel " * 40, 1500))
        count = 0
        async for response in call:
            count += len(response.chunk.token_ids)
            if count >= 5:
                call.cancel()
                break
    await _assert_nothing_left(cluster)


def test_every_service_exports_prometheus_metrics(cluster):
    import urllib.request

    services = {name: url for name, url in cluster.metrics.items() if name != "store"}
    assert {"router", "prefill", "decode-0", "decode-1"} <= set(services)
    for name, url in services.items():
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        assert "snapstream_" in text, name
    router_text = urllib.request.urlopen(services["router"], timeout=5).read().decode()
    assert "snapstream_time_to_first_token_seconds_bucket" in router_text
    from snapstream.kernels import kernel_paths

    for name in ("prefill", "decode-0"):  # the model workers say what their machine runs
        text = urllib.request.urlopen(services[name], timeout=5).read().decode()
        (line,) = [row for row in text.splitlines() if row.startswith("snapstream_machine_info")]
        assert f'int4_matmul="{kernel_paths()["int4_matmul"]}"' in line and "cpu=" in line


async def test_router_serves_reflection(cluster):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async with grpc.aio.insecure_channel(cluster.endpoints["router"]) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for response in stub.ServerReflectionInfo(iter([request])):
            names = {s.name for s in response.list_services_response.service}
            break
    assert {"snapstream.v1.Generation", "grpc.health.v1.Health"} <= names


async def test_killing_the_decode_worker_mid_stream_keeps_the_output_identical(cluster, engine):
    """Runs last in its module: it kills one of the two decode workers."""
    prompt, new_tokens = "failover " * 30, 400
    expected = engine.generate(prompt, new_tokens, policy=ENGINE_POLICY).token_ids
    killed: list[str] = []

    async def kill_serving_worker(received: int) -> None:
        if received != 25 or killed:
            return
        stats = await _decode_stats(cluster)
        serving = [name for name, s in stats.items() if s.running]
        assert len(serving) == 1, stats
        cluster.kill(serving[0])
        killed.append(serving[0])

    started = time.monotonic()
    tokens = await _stream(cluster.endpoints["router"], _request(prompt, new_tokens),
                           kill_serving_worker)
    assert killed, "the stream ended before a worker could be killed"
    assert tokens == expected, f"diverged after failover ({time.monotonic() - started:.1f} s)"
    await _assert_nothing_left(cluster)


async def _supervise(cluster: LocalCluster, done: asyncio.Event) -> None:
    """What ``snapstream up`` does every second: restart the members that exited."""
    while not done.is_set():
        await asyncio.to_thread(cluster.restart_exited)
        await asyncio.sleep(0.2)


async def _all_serving(cluster: LocalCluster, names: set[str]) -> None:
    """Wait until every member in ``names`` reports SERVING (a restarted one takes seconds)."""
    while not all(status == "SERVING" for name, statuses in
                  (await asyncio.to_thread(cluster.health)).items() if name in names
                  for status in statuses.values()):
        await asyncio.sleep(0.2)


async def _running_on(cluster, killed: list[str], timeout_s: float = 30.0) -> list[str]:
    """The decode workers running a sequence, once one that was not killed runs it: tokens
    buffered before a kill keep arriving while the stream is still being placed elsewhere."""
    deadline = time.monotonic() + timeout_s
    while True:
        serving = [name for name, s in (await _decode_stats(cluster)).items() if s.running]
        if any(name not in killed for name in serving) or time.monotonic() > deadline:
            return serving
        await asyncio.sleep(0.05)


async def test_a_stream_that_loses_every_decode_worker_resumes_once_one_restarts(cluster, engine):
    """Runs after the single kill: brings that worker back, then kills the stream's worker and,
    once it has moved, the other one, so no decode worker is left until the supervisor restarts
    them; the router keeps retrying and the client gets the uninterrupted output."""
    done = asyncio.Event()
    supervisor = asyncio.create_task(_supervise(cluster, done))
    decode = {name for name in cluster.endpoints if name.startswith("decode")}
    await _all_serving(cluster, decode)
    done.set()
    await supervisor
    prompt, new_tokens = "lost both workers " * 20, 400
    expected = engine.generate(prompt, new_tokens, policy=ENGINE_POLICY).token_ids
    killed: list[str] = []

    async def kill_serving_worker(received: int) -> None:
        nonlocal supervisor
        if {25: 1, 60: 2}.get(received) != len(killed) + 1:  # the first, then the second kill
            return
        serving = await _running_on(cluster, killed)
        assert len(serving) == 1 and serving[0] not in killed, (serving, killed)
        cluster.kill(serving[0])
        killed.append(serving[0])
        if len(killed) == 2:  # no decode worker left: restart them from now on
            done.clear()
            supervisor = asyncio.create_task(_supervise(cluster, done))

    try:
        tokens = await _stream(cluster.endpoints["router"], _request(prompt, new_tokens),
                               kill_serving_worker)
    finally:
        done.set()
        await supervisor
    assert len(killed) == 2 and set(killed) == decode, killed
    assert tokens == expected
    # the stream resumed as soon as one worker was back; the other may still be starting
    done.clear()
    supervisor = asyncio.create_task(_supervise(cluster, done))
    await _all_serving(cluster, decode)
    done.set()
    await supervisor
    await _assert_nothing_left(cluster)
