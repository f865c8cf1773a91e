"""A member that exits is started again with backoff while the rest keep serving."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from cluster import ClusterSpec, LocalCluster
from cluster.restarts import Backoff, RestartPolicy
from snapstream.client import SnapstreamClient

SUPERVISE_TIMEOUT_S = 120.0


def test_backoff_doubles_until_ready_and_gives_up_on_a_crash_loop() -> None:
    backoff = Backoff(RestartPolicy(first_delay_s=1, max_delay_s=5, max_quick_exits=4))
    delays = []
    for _ in range(4):  # exits before the member is ready again
        delays.append(backoff.on_exit(now=0.0))
        backoff.restarted()
    assert delays == [1, 2, 4, 5]
    assert backoff.on_exit(now=0.0) is None  # the fifth in a row: a crash loop
    backoff.ready()
    assert backoff.on_exit(now=10.0) == 1  # it had become ready: afresh
    assert not backoff.is_due(10.5) and backoff.is_due(11.0)


def _supervise_until(cluster: LocalCluster, seen: str) -> list[str]:
    news, deadline = [], time.monotonic() + SUPERVISE_TIMEOUT_S
    while not any(seen in line for line in news):
        assert time.monotonic() < deadline, news
        news += cluster.restart_exited()
        time.sleep(0.1)
    return news


def _serving(cluster: LocalCluster, name: str) -> bool:
    return all(status == "SERVING" for status in cluster.health()[name].values())


@pytest.mark.slow
def test_a_crashed_worker_and_store_come_back_and_the_cluster_serves(tiny_model: Path,
                                                                     tmp_path: Path) -> None:
    spec = ClusterSpec(model=tiny_model, router_port=0, rows=2, log_dir=tmp_path,
                       restarts=RestartPolicy(first_delay_s=0.2))
    with LocalCluster(spec) as cluster, \
            SnapstreamClient(cluster.endpoints["router"], timeout_s=60) as client:
        for name in ("decode-1", "store"):
            os.kill(cluster.pids[name], signal.SIGKILL)  # a crash, not a stop
            news = _supervise_until(cluster, f"{name} restarted")
            assert f"{name} exited with code -9; restarting in 0 s" in news[0]
            assert cluster.running == set(cluster.endpoints)
            _supervise_until(cluster, f"{name} is ready again")
        assert _serving(cluster, "decode-1")
        for _ in range(4):  # both decode workers take streams again
            assert client.generate("after the crash " * 5, max_new_tokens=8).completion_tokens
    assert (tmp_path / "decode-1.log").read_text().count("snapstream decode serving on") == 2

