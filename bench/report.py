"""Tables on stdout and marked sections in docs/*.md, so several benchmarks share one doc."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import sys
from pathlib import Path

import torch

from snapstream.machine import this_machine


def parse_ints(text: str) -> tuple[int, ...]:
    """A comma-separated list of integers from the command line ("1,4,16"; blanks skipped)."""
    return tuple(int(part) for part in text.split(",") if part.strip())


def parse_names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names from the command line ("redis,nats"; blanks skipped)."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_line() -> str:
    """The machine a report's figures come from (snapstream.machine: the CPU, its features and
    the kernels' paths), the software and the date."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{this_machine().summary()}; torch {torch.__version__}, Python "
            f"{platform.python_version()}; {datetime.date.today().isoformat()}; load average "
            f"{load} (1, 5, 15 min) as the run ended")


# environment variables that change what a benchmark measures: a command line names those set
MEASURED_ENV = ("SNAPSTREAM_KERNELS", "SNAPSTREAM_MATMUL_DTYPE", "ATEN_CPU_CAPABILITY",
                "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
# options that only say where the results go: a published command leaves them out
OUTPUT_OPTIONS = ("--doc", "--json-out")


def command_line() -> str:
    """This run's command as a reader would type it, the variables of MEASURED_ENV first and
    the OUTPUT_OPTIONS left out."""
    env = [f"{name}={shlex.quote(os.environ[name])}" for name in MEASURED_ENV
           if os.environ.get(name)]
    joined = tuple(f"{option}=" for option in OUTPUT_OPTIONS)  # --doc=PATH
    args, kept = iter(sys.argv[1:]), []
    for arg in args:
        if arg in OUTPUT_OPTIONS:
            next(args, None)  # its value
        elif not arg.startswith(joined):
            kept.append(arg)
    return " ".join([*env, "snapstream", *(shlex.quote(arg) for arg in kept)])


def write_section(doc: Path, name: str, body: str) -> None:
    """Replace (or append) the section between ``<!-- bench:NAME -->`` markers in ``doc``."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else f"{text}\n{block}\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


def publish(body: str, section: str, doc: Path | None, results: dict | None = None,
            json_out: Path | None = None) -> None:
    """A benchmark's table: printed, written into ``doc``'s ``section`` (None: not written) and
    its ``results`` into ``json_out`` (None: not written)."""
    print(body)
    if doc is not None:
        write_section(doc, section, body)
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2))


def fmt_ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f}"


def fmt_ratio(num: float | None, den: float | None) -> str:
    return "—" if num is None or den is None else f"{num / den:.2f}×"
