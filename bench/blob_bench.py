"""`bench serve`, blob part: put and get latency and bandwidth of one blob on each KV store
server, started on a free loopback port as the local cluster starts it, and what the blob's MAC
(HMAC-SHA256 under the cluster secret, :mod:`kvstore.seal`) costs to compute once: a prefill
worker pays it on encoding, a decode worker on decoding."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bench.serve_profile import machine_cpu_s, process_cpu_s
from cluster import STORE_SERVERS
from cluster.health import is_accepting
from cluster.process import Child, free_ports
from cluster.stores import StoreAccess
from kvstore import new_blob_key, open_store
from kvstore.seal import ClusterSecret

MIB = 2**20
HOST = "127.0.0.1"
START_TIMEOUT_S = 15.0
TTL_S = 600.0
STORE_MAX_BYTES = 4 << 30  # the store server's limit: room for the largest blob measured
MIN_LOAD_WINDOW_S = 1.0  # CPU times tick at 10 ms: shorter windows say nothing about load


@dataclass(frozen=True)
class BlobBenchConfig:
    stores: tuple[str, ...] = ("redis", "nats")
    sizes: tuple[int, ...] = (MIB, 64 * MIB, 1024 * MIB)  # bytes
    repeats: int = 3

    def __post_init__(self) -> None:
        unknown = set(self.stores) - set(STORE_SERVERS)
        if unknown:
            raise ValueError(f"stores: unknown {sorted(unknown)} (use {', '.join(STORE_SERVERS)})")
        if min(self.sizes, default=0) < 1 or self.repeats < 1:
            raise ValueError("sizes must be >= 1 byte and repeats >= 1")


@dataclass(frozen=True)
class BlobPoint:
    """Median seconds over the repeats."""

    store: str
    size: int  # bytes
    put_s: float
    get_s: float
    mac_s: float  # one HMAC-SHA256 of the blob (its seal, made or checked)
    other_cores: float | None  # cores other processes kept busy meanwhile (None: too short)


def run_blob_bench(cfg: BlobBenchConfig) -> list[BlobPoint]:
    points = []
    with tempfile.TemporaryDirectory(prefix="snapstream-blob-bench-") as tmp:
        for kind in cfg.stores:
            with store_server(kind, Path(tmp) / kind) as (url, pid):
                points += asyncio.run(_measure_store(kind, url, pid, cfg))
    return points


@contextlib.contextmanager
def store_server(kind: str, work_dir: Path) -> Iterator[tuple[str, int]]:
    """A ``kind`` store server (``STORE_SERVERS``) on a free port; yields its URL and pid."""
    server = STORE_SERVERS[kind]
    work_dir.mkdir(parents=True)
    access = StoreAccess(password=secrets.token_urlsafe(24))
    with free_ports(HOST) as take_port:
        port = take_port()
    config = work_dir / server.config_name
    config.touch(mode=0o600)
    config.write_text(server.config(HOST, port, work_dir, access, STORE_MAX_BYTES))
    child = Child(server.argv(config), work_dir / "server.log", dict(os.environ))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not is_accepting(HOST, port):
            if child.has_exited() or time.monotonic() > deadline:
                raise RuntimeError(f"{server.binary} did not start; {child.log_path} ends with:"
                                   f"\n{child.log_tail()}")
            time.sleep(0.05)
        yield server.url(HOST, port, access, STORE_MAX_BYTES), child.pid
    finally:
        child.kill()


async def _measure_store(kind: str, url: str, server_pid: int,
                         cfg: BlobBenchConfig) -> list[BlobPoint]:
    def others_cpu_s() -> float:
        return machine_cpu_s() - process_cpu_s(server_pid) - time.process_time()

    points = []
    async with await open_store(url) as store:
        for size in cfg.sizes:
            data = np.random.default_rng(size).bytes(size)
            puts, gets, macs = [], [], []
            others_start, start_all = others_cpu_s(), time.perf_counter()
            for _ in tqdm(range(cfg.repeats), desc=f"{kind} {size / MIB:g} MiB", leave=False):
                key = new_blob_key()
                start = time.perf_counter()
                await store.put(key, data, ttl_s=TTL_S)
                puts.append(time.perf_counter() - start)
                start = time.perf_counter()
                got = await store.get(key)
                gets.append(time.perf_counter() - start)
                if len(got) != size:
                    raise RuntimeError(f"{kind}: got {len(got)} bytes back, put {size}")
                macs.append(_mac_seconds(got, key))
                del got
                await store.delete(key)
            elapsed_s = time.perf_counter() - start_all
            other_cores = ((others_cpu_s() - others_start) / elapsed_s
                           if elapsed_s >= MIN_LOAD_WINDOW_S else None)
            points.append(BlobPoint(kind, size, statistics.median(puts),
                                    statistics.median(gets), statistics.median(macs),
                                    other_cores))
    return points


def _mac_seconds(data: bytearray, key: str) -> float:
    mac = ClusterSecret(secrets.token_bytes(32)).mac(key)
    start = time.perf_counter()
    mac.update(data)
    mac.digest()
    return time.perf_counter() - start
