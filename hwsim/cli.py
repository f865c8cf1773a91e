"""`snapstream sim`: SN40L decode cost, throughput and memory per tier for one configuration.

Exit status: 0 when the configuration fits, 3 when it does not (the report still prints, with
the tier and shortfall; with --json the object has fits=false and an error field), 2 for
invalid input (raised as ValueError and printed on one line by cli.main).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hwsim.dtypes import DType
from hwsim.hardware import HARDWARE, KvSharding
from hwsim.policy import (
    DEFAULT_N_RECENT,
    DEFAULT_N_SINK,
    DEFAULT_N_TOPK,
    PolicyConfig,
    PolicyKind,
)
from hwsim.report import decode_report, format_text
from hwsim.sim import SimTarget
from hwsim.sweep import DEFAULT_CONTEXTS, format_sweep, sweep

EXIT_DOES_NOT_FIT = 3

# CLI flag -> (SocketSpec field, unit multiplier): bandwidths in GB/s, times in microseconds.
_HARDWARE_FLAGS = {
    "hbm_bandwidth_gbs": ("hbm_bandwidth", 1e9),
    "ddr_bandwidth_gbs": ("ddr_bandwidth", 1e9),
    "p2p_bandwidth_gbs": ("p2p_bandwidth", 1e9),
    "collective_latency_us": ("collective_latency_s", 1e-6),
    "kernel_call_us": ("kernel_call_s", 1e-6),
}


def _add_target_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="shipped target (e.g. llama-3.1-8b, deepseek-v3), a config.json "
                             "path or a checkpoint directory")
    parser.add_argument("--hardware", default="sn40l", choices=sorted(HARDWARE))
    parser.add_argument("--sockets", type=int, default=16, help="tensor-parallel sockets")
    parser.add_argument("--dtype", default="bf16", choices=[d.value for d in DType],
                        help="weight dtype")
    parser.add_argument("--kv-dtype", choices=[d.value for d in DType],
                        help="KV-cache dtype (default: --dtype)")
    parser.add_argument("--kv-sharding", default=KvSharding.HEADS.value,
                        choices=[k.value for k in KvSharding])
    parser.add_argument("--kernel-looping", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--ddr-spill", action="store_true",
                        help="serve what does not fit in HBM from DDR instead of failing")
    for flag, (field, _unit) in _HARDWARE_FLAGS.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", type=float,
                            help=f"override SocketSpec.{field}")


def register(parser: argparse.ArgumentParser) -> None:
    _add_target_flags(parser)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--policy", default=PolicyKind.SNAPSTREAM.value,
                        choices=[p.value for p in PolicyKind])
    parser.add_argument("--n-sink", type=int, default=DEFAULT_N_SINK)
    parser.add_argument("--n-topk", type=int, default=DEFAULT_N_TOPK)
    parser.add_argument("--n-recent", type=int, default=DEFAULT_N_RECENT)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sweep", type=Path, metavar="DIR",
                        help="sweep contexts for both policies and write PNG plots into DIR")
    parser.add_argument("--contexts", default=",".join(map(str, DEFAULT_CONTEXTS)),
                        help="comma-separated contexts for --sweep")


def _target(args: argparse.Namespace) -> SimTarget:
    overrides = {
        field: getattr(args, flag) * unit
        for flag, (field, unit) in _HARDWARE_FLAGS.items()
        if getattr(args, flag) is not None
    }
    policy = PolicyConfig(PolicyKind(args.policy), args.n_sink, args.n_topk, args.n_recent)
    return SimTarget.load(
        args.model, sockets=args.sockets, hardware=args.hardware, dtype=args.dtype,
        kv_dtype=args.kv_dtype, policy=policy, kv_sharding=args.kv_sharding,
        kernel_looping=args.kernel_looping, ddr_spill=args.ddr_spill,
        hardware_overrides=overrides,
    )


def _contexts(text: str) -> tuple[int, ...]:
    try:
        contexts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--contexts: expected comma-separated integers, got {text!r}") from None
    if not contexts or min(contexts) < 1:
        raise ValueError(f"--contexts: every context must be >= 1, got {text!r}")
    return contexts


def _run_sweep(args: argparse.Namespace, target: SimTarget) -> int:
    from hwsim.plots import write_plots  # matplotlib only when plotting

    rows = sweep(target, args.batch, _contexts(args.contexts))
    paths = write_plots(rows, args.sweep)
    if args.json:
        print(json.dumps({"rows": rows, "plots": [str(p) for p in paths]}, indent=2))
    else:
        print(format_sweep(rows))
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def run(args: argparse.Namespace) -> int:
    target = _target(args)
    if args.sweep is not None:
        return _run_sweep(args, target)
    report = decode_report(target, args.batch, args.context)
    print(json.dumps(report, indent=2) if args.json else format_text(report))
    if not report["fits"]:
        if not args.json:
            print(f"error: {report['error']}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return 0
