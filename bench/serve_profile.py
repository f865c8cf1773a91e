"""Where a run's time goes: CPU seconds of every process (from /proc), and mean decode step and
blob transfer times, read as differences of the Prometheus histograms (``_sum``/``_count``)
that the services and the in-process decode loop keep anyway."""

from __future__ import annotations

import os
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

BENCH_PROCESS = "bench"  # this process: the client, and the whole in-process system
OTHER_PROCESSES = "other"  # every process on the machine that is neither this one nor a member


@dataclass(frozen=True)
class Watched:
    """One histogram series of one cluster member (``member`` None: this process)."""

    member: str | None
    metric: str
    labels: tuple[tuple[str, str], ...] = ()


WATCHED: dict[str, Watched] = {
    "in_process_step": Watched(None, "snapstream_decode_step_seconds"),
    "worker_step": Watched("decode-0", "snapstream_decode_step_seconds"),
    "in_process_prefill_queue": Watched(None, "snapstream_queue_time_seconds",
                                        (("service", "prefill"),)),
    "worker_prefill_queue": Watched("prefill", "snapstream_queue_time_seconds",
                                    (("service", "prefill"),)),
    "in_process_prefill": Watched(None, "snapstream_prefill_model_seconds"),
    "worker_prefill": Watched("prefill", "snapstream_prefill_model_seconds"),
    "blob_put": Watched("prefill", "snapstream_blob_transfer_seconds", (("op", "put"),)),
    "blob_get": Watched("decode-0", "snapstream_blob_transfer_seconds", (("op", "get"),)),
}
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Usage:
    """Histogram totals and CPU seconds: cumulative when read (``usage_now``); subtract two
    readings for one run, add runs together."""

    totals: dict[str, tuple[float, float]]  # watched name -> (sum of seconds, count)
    cpu_s: dict[str, float]  # process name -> CPU seconds

    def __sub__(self, other: Usage) -> Usage:
        return self._combine(other, -1.0)

    def __add__(self, other: Usage) -> Usage:
        return self._combine(other, 1.0)

    def summary(self) -> dict[str, dict[str, float | None]]:
        """{"mean_s": mean seconds per observation (None: none observed), "cpu_s": ...}."""
        means = {name: total / count if count else None
                 for name, (total, count) in self.totals.items()}
        return {"mean_s": means, "cpu_s": dict(self.cpu_s)}

    def _combine(self, other: Usage, sign: float) -> Usage:
        totals = {name: (total + sign * other.totals[name][0],
                         count + sign * other.totals[name][1])
                  for name, (total, count) in self.totals.items()}
        return Usage(totals, {name: cpu + sign * other.cpu_s[name]
                              for name, cpu in self.cpu_s.items()})


def usage_now(metrics_urls: dict[str, str], pids: dict[str, int]) -> Usage:
    pages = {member: _scrape(url) for member, url in metrics_urls.items()
             if any(w.member == member for w in WATCHED.values())}
    totals = {}
    for name, watched in WATCHED.items():
        if watched.member is None:
            totals[name] = tuple(
                REGISTRY.get_sample_value(f"{watched.metric}_{part}", dict(watched.labels))
                or 0.0 for part in ("sum", "count"))
        else:
            totals[name] = pages[watched.member].get((watched.metric, watched.labels), (0.0, 0.0))
    cpu = {name: process_cpu_s(pid) for name, pid in pids.items()}
    cpu[BENCH_PROCESS] = time.process_time()
    cpu[OTHER_PROCESSES] = machine_cpu_s() - sum(cpu.values())
    return Usage(totals, cpu)


def process_cpu_s(pid: int, waited_children: bool = False) -> float:
    """User + system CPU seconds of a process (all its threads), with ``waited_children`` also
    those of the ended children it has waited for."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
    ticks = fields[11:15] if waited_children else fields[11:13]  # utime, stime, cutime, cstime
    return sum(map(int, ticks)) / os.sysconf("SC_CLK_TCK")


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its descendants: the living ones, and the
    ended ones it has waited for (a runner's llama-server works in a child process)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            parents[int(entry.name)] = int(fields[1])
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        tree.update(children)
        frontier += children
    total = 0.0
    for member in tree:
        try:
            total += process_cpu_s(member, waited_children=member == pid)
        except OSError:
            continue
    return total


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (all cores, every state but idle/iowait)."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(
            int, stat.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _scrape(url: str) -> dict[SeriesKey, tuple[float, float]]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found: dict[SeriesKey, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for index, part in enumerate(("_sum", "_count")):
                if sample.name.endswith(part):
                    key = (sample.name.removesuffix(part), tuple(sorted(sample.labels.items())))
                    found.setdefault(key, [0.0, 0.0])[index] = sample.value
    return {key: (value[0], value[1]) for key, value in found.items()}
