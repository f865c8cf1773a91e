"""The machine facts: the CPU read from /proc/cpuinfo, the kernels' cap on instruction sets
(SNAPSTREAM_KERNELS, snapstream/csrc/isa.h) and the path each kernel takes under it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from snapstream import kernels
from snapstream.cpu import KERNEL_CAP_ENV, matmul_dtype_name, this_cpu
from snapstream.machine import this_machine

ZEN4 = ("vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9R14\n"
        "flags\t\t: fpu sse avx f16c fma avx2 avx512f avx512bw avx512vl avx512_bf16 "
        "avx512_vnni sha_ni\n")


def test_the_cpu_is_its_model_and_the_features_that_decide_the_kernels():
    cpu = this_cpu(ZEN4)
    assert cpu.model == "AMD EPYC 9R14 (family 25, model 17)"
    assert cpu.features == ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                            "avx512_vnni", "avx512_bf16")
    assert this_cpu("flags : fpu sse\n").summary().endswith("none of AVX2/AVX-512/AMX")


def test_bfloat16_prompts_need_bfloat16_hardware_and_the_native_cap(monkeypatch):
    flags = frozenset(this_cpu(ZEN4).features)
    assert matmul_dtype_name(flags) == "bfloat16"
    assert matmul_dtype_name(frozenset({"avx2", "fma"})) == "float32"
    monkeypatch.setenv(KERNEL_CAP_ENV, "avx512")
    assert matmul_dtype_name(flags) == "float32"
    monkeypatch.setenv(KERNEL_CAP_ENV, "sse9")
    with pytest.raises(ValueError, match="SNAPSTREAM_KERNELS must be one of"):
        matmul_dtype_name(flags)


def test_each_cap_keeps_only_the_instruction_sets_below_it(kernel_cap):
    kernel_cap("native")
    native = set(kernels.isa())
    for cap, allowed in (("avx512", {"avx2", "avx_vnni", "avx512"}),
                         ("avx2", {"avx2", "avx_vnni"}), ("generic", set())):
        kernel_cap(cap)
        assert set(kernels.isa()) == native & allowed
    with pytest.raises(RuntimeError, match="want native, avx512, avx2 or generic"):
        kernel_cap("avx3")


def test_the_generic_cap_sends_every_kernel_down_plain_cpp(kernel_cap):
    kernel_cap("generic")
    paths = kernels.kernel_paths()
    assert set(paths) == {"int4_matmul", "int8_matmul", "slot_attention",
                          "prompt_attention_float32", "prompt_attention_bfloat16",
                          "row_kernels"}
    assert all(path in ("generic", "torch-sdpa") for path in paths.values())


def test_the_avx2_cap_takes_the_avx2_kernels_where_the_cpu_has_them(kernel_cap):
    if "avx2" not in this_cpu().features:
        pytest.skip("no AVX2 on this CPU")
    kernel_cap("avx2")
    paths = kernels.kernel_paths()
    assert paths["int4_matmul"] == "avx2-codes"
    assert paths["int8_matmul"] in ("avx2", "avx-vnni")
    assert paths["slot_attention"] == paths["row_kernels"] == "avx2"


def test_avx512_vnni_without_amx_takes_the_vnni_codes_kernel_for_int4(kernel_cap):
    kernel_cap("native")
    isa = set(kernels.isa())
    if "avx512_vnni" not in isa or "amx" in isa:
        pytest.skip(f"wants AVX512-VNNI without AMX ({sorted(isa)})")
    paths = kernels.kernel_paths()
    assert paths["int4_matmul"] == "avx512-vnni-codes"
    assert paths["int8_matmul"] == "avx512-vnni"
    assert torch.ops.snapstream.int4_matmul_reads_codes(32)
    assert not torch.ops.snapstream.int4_matmul_reads_codes(8)  # bfloat16 pairs take those


def test_an_unknown_cap_in_the_environment_stops_the_import():
    run = subprocess.run([sys.executable, "-c", "import snapstream.kernels"],
                         env={**os.environ, KERNEL_CAP_ENV: "avx3"}, capture_output=True,
                         text=True)
    assert run.returncode != 0
    assert "SNAPSTREAM_KERNELS must be native, avx512, avx2 or generic" in run.stderr


def test_the_machine_report_names_the_cpu_every_kernel_and_the_dtypes():
    machine = this_machine()
    text = "\n".join(machine.lines())
    assert machine.cpu.model in text and f"cap {machine.kernel_cap}" in text
    assert all(f"{kernel}: {path}" in text for kernel, path in machine.kernel_paths)
    assert "prompt float32" in text or "prompt bfloat16" in text
    assert machine.labels()["int4_matmul"] == dict(machine.kernel_paths)["int4_matmul"]
