"""What this machine runs: the CPU, the kernels' cap and the path each kernel takes under it, the
dtypes and the threads. ``snapstream info`` prints it, every service exports it on /metrics and
every benchmark report opens with it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from snapstream import kernels
from snapstream.cpu import Cpu, matmul_dtype_name, this_cpu

DECODE_DTYPE = "float32"  # the decode step's activations (snapstream/quant.py)


@dataclass(frozen=True)
class Machine:
    cpu: Cpu
    kernel_cap: str  # snapstream.cpu.KERNEL_CAPS
    kernel_isa: tuple[str, ...]  # the extensions the kernels use under the cap
    kernel_paths: tuple[tuple[str, str], ...]  # (kernel, path)
    prompt_dtype: str  # a quantized model's prompt GEMMs
    threads: int  # torch's intra-op threads

    def lines(self) -> list[str]:
        """The report, a line per fact."""
        isa = " ".join(self.kernel_isa) or "none (plain C++)"
        return [f"cpu: {self.cpu.summary()}",
                f"kernels: cap {self.kernel_cap}, instruction sets {isa}",
                *(f"  {kernel}: {path}" for kernel, path in self.kernel_paths),
                f"dtypes: prompt {self.prompt_dtype} (quantized models), decode {DECODE_DTYPE}",
                f"threads: {self.threads}"]

    def summary(self) -> str:
        """The report in one line (a benchmark's header)."""
        paths = ", ".join(f"{kernel} {path}" for kernel, path in self.kernel_paths)
        return (f"{self.cpu.summary()}; kernels (cap {self.kernel_cap}): {paths}; prompt "
                f"{self.prompt_dtype}, decode {DECODE_DTYPE}; {self.threads} threads")

    def labels(self) -> dict[str, str]:
        """The report as Prometheus info labels."""
        return {"cpu": self.cpu.model, "features": " ".join(self.cpu.features),
                "cores": str(self.cpu.cores), "kernel_cap": self.kernel_cap,
                **{kernel: path for kernel, path in self.kernel_paths},
                "prompt_dtype": self.prompt_dtype, "decode_dtype": DECODE_DTYPE,
                "threads": str(self.threads)}


def this_machine() -> Machine:
    return Machine(cpu=this_cpu(), kernel_cap=kernels.kernel_cap(),
                   kernel_isa=tuple(kernels.isa()),
                   kernel_paths=tuple(kernels.kernel_paths().items()),
                   prompt_dtype=matmul_dtype_name(), threads=torch.get_num_threads())
