"""A whole cluster as processes on a tiny model, over each store: healthy, then gone."""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
from pathlib import Path

import pytest

from cluster import ClusterError, ClusterSpec, LocalCluster
from cluster.restarts import RestartPolicy
from snapstream.client import SnapstreamClient
from tests.cluster.helpers import process_trees, still_running

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("store", "tls"), [("redis", False), ("nats", True)])
def test_cluster_serves_then_stops_leaving_no_process(store: str, tls: bool, tiny_model: Path,
                                                      tmp_path: Path) -> None:
    spec = ClusterSpec(store=store, model=tiny_model, router_port=0, rows=2, log_dir=tmp_path,
                       tls=tls)
    with LocalCluster(spec) as cluster:
        assert set(cluster.endpoints) == {"store", "prefill", "decode-0", "decode-1", "router"}
        scheme = {"redis": "redis", "nats": "tls" if tls else "nats"}[store]
        assert re.match(f"{scheme}://[a-z]*:[^@]{{32}}@127.0.0.1:", cluster.endpoints["store"])
        assert cluster.store_config.stat().st_mode & 0o777 == 0o600
        with SnapstreamClient(cluster.endpoints["router"], timeout_s=60,
                              tls=cluster.client_tls) as client:
            assert client.generate("through the store " * 4, max_new_tokens=6).completion_tokens
        health = cluster.health()
        assert set(health) == {"prefill", "decode-0", "decode-1", "router"}
        assert all(status == "SERVING" for checks in health.values()
                   for status in checks.values()), health
        processes = process_trees(list(cluster.pids.values()))
        assert {pid for pid, _ in processes} >= set(cluster.pids.values())

        assert cluster.kill("decode-1") == -signal.SIGKILL  # a crash drill: stop() skips it
        assert cluster.exited() == {}
        assert cluster.running == {"store", "prefill", "decode-0", "router"}
    codes = cluster.stop()
    assert still_running(processes) == set()
    assert codes["decode-1"] == -signal.SIGKILL
    assert all(codes[name] == 0 for name in ("router", "prefill", "decode-0")), codes
    assert codes["store"] >= 0, codes  # exited on SIGTERM (nats-server says 1), not killed
    assert (tmp_path / "router.log").read_text().count("snapstream router serving on") == 1


def test_a_member_that_cannot_start_fails_the_start_with_its_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the log directory goes
    spec = ClusterSpec(model=tmp_path / "missing", router_port=0, decode_workers=1)
    cluster = LocalCluster(spec)
    with pytest.raises(ClusterError, match=r"could not start: model .*missing does not exist"):
        cluster.start()  # the line the member's log ends with, and where that log is
    assert all(code is not None for code in cluster.stop().values())
    assert cluster.logs_kept and cluster.log_dir.parent == tmp_path  # a fault: kept to read
    assert "does not exist" in (cluster.log_dir / "prefill.log").read_text()


def test_a_temporary_log_dir_goes_with_a_clean_stop_and_stays_after_a_crash(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spec = ClusterSpec(model=tiny_model, router_port=0, rows=2, decode_workers=1,
                       restarts=RestartPolicy(first_delay_s=0.1))
    with LocalCluster(spec) as clean:
        assert (clean.log_dir / "store" / "cluster-secret").is_file()
        assert clean.kill("decode-0") == -signal.SIGKILL  # a drill, not a fault
        news, deadline = [], time.monotonic() + 60
        while "decode-0 is ready again" not in news and time.monotonic() < deadline:
            news += clean.restart_exited()
            time.sleep(0.1)
        assert "decode-0 is ready again" in news, news
    assert not clean.logs_kept and list(tmp_path.iterdir()) == []
    with LocalCluster(spec) as crashed:
        os.kill(crashed.pids["decode-0"], signal.SIGKILL)
        os.waitid(os.P_PID, crashed.pids["decode-0"], os.WEXITED | os.WNOWAIT)
    assert crashed.stop()["decode-0"] == -signal.SIGKILL
    assert crashed.logs_kept and (crashed.log_dir / "decode-0.log").is_file()
