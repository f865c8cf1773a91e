"""`snapstream info`: what this machine runs: the CPU and the features that decide the kernels'
speed, the kernels' cap (SNAPSTREAM_KERNELS) and the path each kernel takes under it, the
dtypes and the threads (snapstream.machine; the services export the same on /metrics, the
benchmark reports open with it)."""

from __future__ import annotations

import argparse
import json

from snapstream.machine import this_machine


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")


def run(args: argparse.Namespace) -> int:
    machine = this_machine()
    print(json.dumps(machine.labels(), indent=2) if args.json else "\n".join(machine.lines()))
    return 0
