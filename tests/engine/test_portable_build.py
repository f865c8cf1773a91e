"""The kernels compile for a CPU that is not x86-64: every source in snapstream/csrc passes
aarch64 g++'s checks against torch's headers (syntax and types; no aarch64 torch to link
against here), so an ARM build gets the plain loops of the generic cap (csrc/isa.h) rather than
an x86 intrinsic it cannot compile."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from torch.utils.cpp_extension import include_paths

pytestmark = pytest.mark.slow
CSRC = Path(__file__).resolve().parents[2] / "snapstream" / "csrc"
CROSS = "aarch64-linux-gnu-g++"  # Debian's g++-aarch64-linux-gnu (scripts/test.sh installs it)


def check(source: Path) -> tuple[Path, subprocess.CompletedProcess]:
    flags = ["-std=c++17", "-fsyntax-only", "-O2", "-fopenmp",
             *(f"-I{p}" for p in include_paths()), f"-I{sysconfig.get_paths()['include']}"]
    return source, subprocess.run([CROSS, *flags, str(source)], capture_output=True, text=True)


def test_every_kernel_source_compiles_for_aarch64():
    assert shutil.which(CROSS), f"{CROSS} is missing: apt-get install g++-aarch64-linux-gnu"
    sources = sorted(CSRC.glob("*.cpp"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = {source.name: done.stderr[-2000:]
                  for source, done in pool.map(check, sources) if done.returncode}
    assert not failed, failed
