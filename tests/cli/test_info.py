"""`snapstream info`: the machine report (snapstream.machine) as lines or JSON."""

from __future__ import annotations

import json

from cli.main import main
from snapstream import kernels


def test_info_prints_the_cpu_and_every_kernels_path(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cpu: ")
    assert all(f"{kernel}: {path}" in out for kernel, path in kernels.kernel_paths().items())


def test_info_json_holds_the_same_facts(capsys, kernel_cap):
    kernel_cap("generic")
    assert main(["info", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["kernel_cap"] == "generic" and facts["int4_matmul"] == "generic"
    assert {"cpu", "features", "cores", "prompt_dtype", "decode_dtype", "threads"} <= set(facts)
