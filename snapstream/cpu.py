"""This CPU's instruction-set flags, from /proc/cpuinfo, and what they decide: the dtype of the
prompt forward's GEMMs (torch-free, so that the CLIs and the peers' builds can ask too)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})  # bfloat16 products in hardware
MATMUL_DTYPES = ("bfloat16", "float32")
MATMUL_DTYPE_ENV = "SNAPSTREAM_MATMUL_DTYPE"


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The ``flags`` of ``cpuinfo`` (this machine's /proc/cpuinfo when None; empty when it
    cannot be read)."""
    if cpuinfo is None:
        return _this_cpu()
    return frozenset(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                           if line.startswith("flags")), []))


@functools.cache
def _this_cpu() -> frozenset[str]:
    try:
        return cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()


def matmul_dtype_name(flags: frozenset[str] | None = None) -> str:
    """The dtype of a prompt's activations and GEMMs on a CPU with ``flags`` (None: this one):
    bfloat16 where it multiplies bfloat16 in hardware (AVX512-BF16 or AMX: oneDNN's bfloat16
    GEMM runs at ~3x its float32 rate there), else float32 (oneDNN emulates bfloat16 elsewhere:
    ~0.25x its float32 rate on a Skylake-SP, docs/benchmarks.md "Prefill"). The environment variable
    SNAPSTREAM_MATMUL_DTYPE (bfloat16 or float32) overrides it."""
    forced = os.environ.get(MATMUL_DTYPE_ENV)
    if forced:
        if forced not in MATMUL_DTYPES:
            raise ValueError(f"{MATMUL_DTYPE_ENV} must be one of {list(MATMUL_DTYPES)}, got "
                             f"{forced!r}")
        return forced
    return "bfloat16" if NATIVE_BF16 & (cpu_flags() if flags is None else flags) else "float32"
