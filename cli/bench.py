"""`snapstream bench NAME`: benchmarks, each writing its figures into docs/."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: dict[str, str] = {
    "engine": "bench.engine_cli",
    "serve": "bench.serve_cli",
    "peers": "bench.peers.cli",
    "faults": "bench.faults.cli",
    "quant": "bench.quant_cli",
    "kernels": "bench.kernel_bench",
    "kv": "bench.kv_cli",
    "kv-dtype": "bench.kv_dtype_bench",
    "capacity": "bench.capacity_bench",
    "prefill": "bench.prefill_bench",
    "specprefill": "bench.specprefill_bench",
}


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", required=True, parser_class=type(parser))
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        bench = sub.add_parser(name, help=module.__doc__.splitlines()[0])
        module.register(bench)
        bench.set_defaults(_bench=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args._bench(args) or 0)
