"""The faults benchmark's scenarios, looked up by name in ``SCENARIOS``: each runs load through
a live cluster while it injects its faults, and returns what it saw."""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from bench.faults.load import Tally, closed_loop, wait_for
from bench.faults.poison import POISON, send_raw
from bench.faults.tenants import tenant_cases
from cluster import LocalCluster
from kvstore import open_store
from prefill_svc.prefix_store import KEY_PREFIX
from snapstream.client import AsyncSnapstreamClient
from snapstream.v1 import decode_pb2, decode_pb2_grpc, generation_pb2


@dataclass(frozen=True)
class FaultConfig:
    decode_kills: int = 50
    prefill_kills: int = 10
    store_restarts: int = 5
    poison_rounds: int = 20  # each sends every poison request once, beside the normal load
    tenant_rounds: int = 5  # each sends a new document as two tenants (bench/faults/tenants.py)
    deadline_requests: int = 200  # normal requests with a client deadline of 0.05-2 s
    soak_s: float = 600.0
    soak_streams: int = 200
    streams: int = 8  # concurrent normal streams during the fault scenarios
    max_new_tokens: int = 64
    hang_timeout_s: float = 120.0  # a request not ended by then counts as hung
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("decode_kills", "prefill_kills", "store_restarts", "poison_rounds",
                     "tenant_rounds", "deadline_requests"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("soak_s", "hang_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if min(self.soak_streams, self.streams, self.max_new_tokens) < 1:
            raise ValueError("soak_streams, streams and max_new_tokens must be >= 1")


@dataclass
class Result:
    scenario: str
    faults: int
    tally: Tally
    recoveries_s: list[float] = field(default_factory=list)
    unrecovered: int = 0  # faults after which the member never served again
    codes: Counter = field(default_factory=Counter)  # "request: status" -> times
    blobs_left: int = 0
    rows_left: int = 0
    seconds: float = 0.0

    def recovery(self) -> str:
        if not self.recoveries_s:
            return "—"
        return (f"{statistics.median(self.recoveries_s):.1f} / {max(self.recoveries_s):.1f}"
                + (f" ({self.unrecovered} never)" if self.unrecovered else ""))


@dataclass
class FaultRun:
    """One live cluster, its client and the undisturbed run's tokens; cluster calls (they
    block) go through one lock, one at a time, off the event loop."""

    cluster: LocalCluster
    client: AsyncSnapstreamClient  # with the key of tenant "load"
    keys: dict[str, str]  # tenant -> its API key
    expected: dict[str, tuple]
    config: FaultConfig
    rng: random.Random
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def call(self, function: Callable, *args: object) -> object:
        async with self.lock:
            return await asyncio.to_thread(function, *args)

    async def supervise(self) -> None:
        """What `snapstream up` does: restart members that exit, with backoff (a crash loop
        raises ClusterError, which ends the benchmark)."""
        while True:
            await self.call(self.cluster.restart_exited)
            await asyncio.sleep(0.2)

    async def serving(self, name: str) -> bool:
        health = await self.call(self.cluster.health)
        return all(status == "SERVING" for status in health.get(name, {"": "?"}).values())

    async def decode_running(self) -> dict[str, int]:
        running = {}
        for name, address in self.cluster.endpoints.items():
            if name.startswith("decode"):
                try:
                    async with grpc.aio.insecure_channel(address) as channel:
                        stats = await decode_pb2_grpc.DecodeStub(channel).Stats(
                            decode_pb2.StatsRequest(), timeout=2)
                    running[name] = stats.running + stats.queue_depth
                except grpc.aio.AioRpcError:
                    continue
        return running


async def _under_load(run: FaultRun, streams: int, inject: Callable[[Result], Awaitable[None]],
                      result: Result) -> Result:
    stop = asyncio.Event()
    load = asyncio.ensure_future(closed_loop(run.client, run.expected, streams, stop,
                                             run.config.max_new_tokens,
                                             run.config.hang_timeout_s))
    try:
        await inject(result)
    finally:
        stop.set()
        result.tally = await load
    return result


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def _recovered(result: Result, seconds: float | None, total: int) -> None:
    """Count one fault's recovery (None: never) and show progress on stderr."""
    if seconds is None:
        result.unrecovered += 1
    else:
        result.recoveries_s.append(seconds)
    after = "never recovered" if seconds is None else f"recovered in {seconds:.1f} s"
    _progress(f"{result.scenario} {result.faults}/{total}: {after}")


async def _kill_and_recover(run: FaultRun, name: str, result: Result, total: int) -> None:
    await run.call(run.cluster.kill, name)
    result.faults += 1
    _recovered(result, await wait_for(lambda: run.serving(name), timeout_s=180.0), total)
    await asyncio.sleep(run.rng.uniform(0.5, 1.5))


async def decode_kills(run: FaultRun) -> Result:
    """SIGKILL a decode worker that is streaming, wait until it serves again, repeat."""
    async def inject(result: Result) -> None:
        for _ in range(run.config.decode_kills):
            await wait_for(lambda: _any_busy(run), timeout_s=30.0, interval_s=0.05)
            running = await run.decode_running()
            busy = [name for name, count in running.items() if count]
            victim = run.rng.choice(busy or sorted(running) or ["decode-0"])
            await _kill_and_recover(run, victim, result, run.config.decode_kills)

    return await _under_load(run, run.config.streams, inject, Result("decode kills", 0, Tally()))


async def _any_busy(run: FaultRun) -> bool:
    return any((await run.decode_running()).values())


async def prefill_kills(run: FaultRun) -> Result:
    async def inject(result: Result) -> None:
        for _ in range(run.config.prefill_kills):
            await _kill_and_recover(run, "prefill", result, run.config.prefill_kills)

    return await _under_load(run, run.config.streams, inject,
                             Result("prefill kills", 0, Tally()))


async def store_restarts(run: FaultRun) -> Result:
    """SIGKILL the store server; recovered once a new request through the router succeeds."""
    async def inject(result: Result) -> None:
        for _ in range(run.config.store_restarts):
            await run.call(run.cluster.kill, "store")
            result.faults += 1
            recovered = await wait_for(lambda: _request_succeeds(run), timeout_s=180.0,
                                       interval_s=0.5)
            _recovered(result, recovered, run.config.store_restarts)
            await asyncio.sleep(run.rng.uniform(1.0, 2.0))

    return await _under_load(run, run.config.streams, inject,
                             Result("store restarts", 0, Tally()))


async def _request_succeeds(run: FaultRun) -> bool:
    try:
        await run.client.generate("probe", max_new_tokens=2, timeout_s=10)
    except Exception:
        return False
    return True


async def poison(run: FaultRun) -> Result:
    """Every poison request, ``poison_rounds`` times, beside the normal load."""
    async def inject(result: Result) -> None:
        for done in range(1, run.config.poison_rounds + 1):
            for name, request in POISON.items():
                code = await send_raw(run.cluster.endpoints["router"], request,
                                      run.keys["load"])
                result.codes[f"{name}: {code}"] += 1
                result.faults += 1
            _progress(f"poison round {done}/{run.config.poison_rounds}")

    return await _under_load(run, run.config.streams, inject, Result("poison", 0, Tally()))


async def tenants(run: FaultRun) -> Result:
    """Two tenants send one document, beside the normal load: the second stores its own copy
    (no hit tells it what the first sent), the first hits its own; a cache_salt is a namespace
    of its own; a key of no tenant is refused."""
    async def inject(result: Result) -> None:
        for done in range(1, run.config.tenant_rounds + 1):
            seen = await tenant_cases(run.cluster.endpoints["router"], run.keys, done)
            for case, outcome in seen.items():
                result.codes[f"{case}: {outcome}"] += 1
            result.faults += 1
            _progress(f"tenants round {done}/{run.config.tenant_rounds}")

    return await _under_load(run, run.config.streams, inject, Result("tenants", 0, Tally()))


async def deadlines(run: FaultRun) -> Result:
    """Normal requests whose client deadline (0.05-2 s) strikes anywhere, in the prefill's
    put included: each must end, and none may leave its blob behind."""
    async def inject(result: Result) -> None:
        prompts = sorted(run.expected)
        for done in range(1, run.config.deadline_requests + 1):
            body = generation_pb2.GenerateRequest(
                prompt=run.rng.choice(prompts),
                max_new_tokens=run.config.max_new_tokens).SerializeToString()
            code = await send_raw(run.cluster.endpoints["router"], body, run.keys["load"],
                                  timeout_s=run.rng.uniform(0.05, 2.0))
            result.codes[f"deadline 0.05-2 s: {code}"] += 1
            result.faults += 1
            if done % 50 == 0:
                _progress(f"deadlines {done}/{run.config.deadline_requests}")

    return await _under_load(run, run.config.streams, inject, Result("deadlines", 0, Tally()))


async def soak(run: FaultRun) -> Result:
    async def inject(result: Result) -> None:
        start = time.monotonic()
        while (left := run.config.soak_s - (time.monotonic() - start)) > 0:
            await asyncio.sleep(min(60.0, left))
            _progress(f"soak {time.monotonic() - start:.0f}/{run.config.soak_s:.0f} s")

    return await _under_load(run, run.config.soak_streams, inject, Result("soak", 0, Tally()))


SCENARIOS: dict[str, Callable[[FaultRun], Awaitable[Result]]] = {
    "decode-kills": decode_kills,
    "prefill-kills": prefill_kills,
    "store-restarts": store_restarts,
    "poison": poison,
    "tenants": tenants,
    "deadlines": deadlines,
    "soak": soak,
}


async def leaks(run: FaultRun, settle_s: float = 60.0) -> tuple[int, int]:
    """(request blobs in the store, busy or queued decode rows) once the cluster has settled;
    the document cache's entries stay by design (their TTL removes them)."""
    store = await open_store(run.cluster.endpoints["store"])

    async def blobs() -> list[str]:
        return [key for key in await store.keys() if not key.startswith(KEY_PREFIX)]

    try:
        async def settled() -> bool:
            return not await blobs() and not any((await run.decode_running()).values())

        await wait_for(settled, settle_s, interval_s=0.5)
        return len(await blobs()), sum((await run.decode_running()).values())
    finally:
        await store.close()
