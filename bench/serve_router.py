"""The system under test of `bench serve`: a local cluster (store, one prefill worker, one
decode worker, router) as processes, driven through the public client SDK."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from bench.serve_workload import RequestTrace, ServeBenchConfig
from cluster import ClusterSpec, LocalCluster
from snapstream.client import AsyncSnapstreamClient


@contextlib.contextmanager
def serving_cluster(cfg: ServeBenchConfig, model: str | None) -> Iterator[LocalCluster]:
    """One decode worker with ``cfg.rows`` rows, so that it matches the in-process loop. Both
    workers queue up to ``cfg.max_queue`` requests (``SNAPSTREAM_MAX_QUEUE``), so the prefill
    worker never turns a request away (its default queue is 16)."""
    spec = ClusterSpec(store=cfg.store, model=model, router_port=0, decode_workers=1,
                       rows=cfg.rows, torch_threads=cfg.torch_threads, drain_timeout_s=5.0)
    with _environment(SNAPSTREAM_MAX_QUEUE=str(cfg.max_queue)):  # read as the members start
        cluster = LocalCluster(spec).start()
    try:
        yield cluster
    finally:
        cluster.stop()


class RouterClient:
    """Greedy requests with the benchmark's policy; a token's arrival is stamped when the
    client SDK hands over the chunk that carries it."""

    def __init__(self, client: AsyncSnapstreamClient, cfg: ServeBenchConfig) -> None:
        policy = cfg.policy
        self.client = client
        self.options = dict(
            max_new_tokens=cfg.max_new_tokens, temperature=0.0, policy=policy.kind,
            n_sink=policy.n_sink, n_topk=policy.n_topk, n_recent=policy.n_recent,
            observation=policy.observation, kernel=policy.kernel, pooling=policy.pooling)

    async def generate(self, ids: list[int]) -> RequestTrace:
        arrivals: list[float] = []
        token_ids: list[int] = []
        sent = time.perf_counter()
        async for chunk in self.client.generate_stream(ids, **self.options):
            now = time.perf_counter()
            arrivals += [now] * len(chunk.token_ids)  # > 1 when the stream fell behind
            token_ids += chunk.token_ids
        return RequestTrace(sent, tuple(arrivals), tuple(token_ids))


@contextlib.contextmanager
def _environment(**variables: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value
