"""This CPU's instruction-set flags, from /proc/cpuinfo (what the peers' builds and reports
depend on)."""

from __future__ import annotations

from pathlib import Path


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The ``flags`` of ``cpuinfo`` (this machine's /proc/cpuinfo when None; empty when it
    cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    return frozenset(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                           if line.startswith("flags")), []))
