"""This CPU: its model, the instruction-set features that decide the kernels' speed (from
/proc/cpuinfo), the cap on the kernels' instruction sets, and what they decide: the dtype of the
prompt forward's GEMMs. Torch-free, so that the CLIs and the peers' builds can ask too; the
kernels read the same cap (snapstream/csrc/isa.h) and report their paths through
``snapstream.kernels.kernel_paths``."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

# the /proc/cpuinfo flags that decide which kernels run, lowest first
FEATURES = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
            "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})  # bfloat16 products in hardware
MATMUL_DTYPES = ("bfloat16", "float32")
MATMUL_DTYPE_ENV = "SNAPSTREAM_MATMUL_DTYPE"
# the highest instruction set the kernels may use (snapstream/csrc/isa.h): native (all the CPU
# has), avx512 (F/BW/VL without VNNI, BF16 or AMX), avx2, generic (plain C++)
KERNEL_CAPS = ("native", "avx512", "avx2", "generic")
KERNEL_CAP_ENV = "SNAPSTREAM_KERNELS"


@dataclass(frozen=True)
class Cpu:
    """What /proc/cpuinfo says of this CPU."""

    model: str  # its model name, family and model numbers (a VM may mask them)
    features: tuple[str, ...]  # of FEATURES, those it has
    cores: int

    def summary(self) -> str:
        extensions = " ".join(self.features) or "none of AVX2/AVX-512/AMX"
        return f"{self.model}, {self.cores} cores, {extensions}"


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The ``flags`` of ``cpuinfo`` (this machine's /proc/cpuinfo when None; empty when it
    cannot be read)."""
    return frozenset(_field(cpuinfo, "flags").split())


def this_cpu(cpuinfo: str | None = None) -> Cpu:
    """``cpuinfo``'s CPU (this machine's when None)."""
    flags = cpu_flags(cpuinfo)
    name = _field(cpuinfo, "model name") or "unknown CPU"
    family, model = _field(cpuinfo, "cpu family"), _field(cpuinfo, "model")
    numbers = f" (family {family}, model {model})" if family and model else ""
    return Cpu(model=f"{name}{numbers}", features=tuple(f for f in FEATURES if f in flags),
               cores=os.cpu_count() or 1)


def capped_flags(flags: frozenset[str] | None = None, cap: str | None = None) -> frozenset[str]:
    """``flags`` (this CPU's when None) less what a CPU of ``cap``'s kind lacks (None: the cap
    in force), as snapstream/csrc/isa.h caps the kernels: avx512 keeps AVX-512's foundation
    (F, BW, VL, CD, DQ) and drops its later extensions and AMX, avx2 and generic drop every
    AVX-512 and AMX flag. A peer built for "this machine" under the cap
    (bench/peers/recipes.py) is then forced down the same way as snapstream's kernels."""
    flags = cpu_flags() if flags is None else flags
    cap = kernel_cap_name() if cap is None else cap
    if cap == "native":
        return flags
    kept = {"avx512f", "avx512bw", "avx512vl", "avx512cd", "avx512dq"} if cap == "avx512" else set()
    return frozenset(f for f in flags
                     if f in kept or not f.startswith(("avx512", "amx")))


def kernel_cap_name() -> str:
    """The cap on the kernels' instruction sets: $SNAPSTREAM_KERNELS, native when unset."""
    cap = os.environ.get(KERNEL_CAP_ENV) or "native"
    if cap not in KERNEL_CAPS:
        raise ValueError(f"{KERNEL_CAP_ENV} must be one of {list(KERNEL_CAPS)}, got {cap!r}")
    return cap


def matmul_dtype_name(flags: frozenset[str] | None = None) -> str:
    """The dtype of a prompt's activations and GEMMs on a CPU with ``flags`` (None: this one):
    bfloat16 where it multiplies bfloat16 in hardware (AVX512-BF16 or AMX: oneDNN's bfloat16
    GEMM runs at ~3x its float32 rate there) and the kernels' cap is native, else float32
    (oneDNN emulates bfloat16 elsewhere, at a fraction of its float32 rate). The environment
    variable SNAPSTREAM_MATMUL_DTYPE (bfloat16 or float32) overrides it."""
    forced = os.environ.get(MATMUL_DTYPE_ENV)
    if forced:
        if forced not in MATMUL_DTYPES:
            raise ValueError(f"{MATMUL_DTYPE_ENV} must be one of {list(MATMUL_DTYPES)}, got "
                             f"{forced!r}")
        return forced
    native = NATIVE_BF16 & (cpu_flags() if flags is None else flags)
    return "bfloat16" if native and kernel_cap_name() == "native" else "float32"


def _field(cpuinfo: str | None, name: str) -> str:
    """The first value of field ``name`` in ``cpuinfo`` ('' when absent)."""
    text = _this_cpuinfo() if cpuinfo is None else cpuinfo
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


@functools.cache
def _this_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
