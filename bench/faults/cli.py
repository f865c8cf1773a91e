"""The cluster under faults: decode and prefill kills, store restarts, poison requests and a
soak (writes docs/reliability.md)."""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

from bench.faults.load import reference
from bench.faults.scenarios import SCENARIOS, FaultConfig, FaultRun, Result, leaks
from bench.faults.tenants import write_keys
from bench.report import command_line, markdown_table, write_section
from cluster import ClusterSpec, LocalCluster
from cluster.restarts import RestartPolicy
from serving.settings import add_model_setting
from snapstream.checkpoints.registry import model_path
from snapstream.client import AsyncSnapstreamClient

DOC = Path("docs/reliability.md")


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        raise ValueError(f"unknown scenario(s) {sorted(unknown)}; use {', '.join(SCENARIOS)}")
    return names


def register(parser: argparse.ArgumentParser) -> None:
    add_model_setting(parser)
    parser.add_argument("--store", choices=("redis", "nats"), default="redis")
    parser.add_argument("--scenarios", type=_names, default=tuple(SCENARIOS),
                        help=",".join(SCENARIOS))
    for spec in fields(FaultConfig):
        parser.add_argument(f"--{spec.name.replace('_', '-')}", type=type(spec.default),
                            default=spec.default)
    parser.add_argument("--rows", type=int, default=8, help="per decode worker (2 workers)")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--doc", default=str(DOC), help="where the table goes ('': nowhere)")


def run(args: argparse.Namespace) -> int:
    config = FaultConfig(**{f.name: getattr(args, f.name) for f in fields(FaultConfig)})
    # SIGTERM unwinds as Ctrl-C does, so that the cluster is stopped, not orphaned
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="snapstream-faults-") as tmp:
        keys_file = Path(tmp) / "api-keys"
        keys = write_keys(keys_file)  # the router asks for the keys of two tenants
        spec = ClusterSpec(store=args.store, model=model_path(args.model),
                           router_port=0, rows=args.rows, torch_threads=args.torch_threads,
                           drain_timeout_s=5.0, restarts=RestartPolicy(first_delay_s=0.5),
                           api_keys_file=keys_file)
        with LocalCluster(spec) as cluster:
            print(f"cluster up ({args.store}); logs in {cluster.log_dir}", file=sys.stderr)
            results = asyncio.run(_run_all(cluster, config, args.scenarios, keys))
    table = _table(results)
    print(table)
    if args.doc:
        write_section(Path(args.doc), f"faults-{args.store}-{'-'.join(args.scenarios)}",
                      f"`{command_line()}` ({args.store}, model {spec.model.name})\n\n{table}")
    return 0


async def _run_all(cluster, config: FaultConfig, names: tuple[str, ...],
                   keys: dict[str, str]) -> list[Result]:
    async with AsyncSnapstreamClient(cluster.endpoints["router"],
                                     api_key=keys["load"]) as client:
        run = FaultRun(cluster, client, keys, await reference(client, config.max_new_tokens),
                       config, random.Random(config.seed))
        supervisor = asyncio.ensure_future(run.supervise())
        results = []
        try:
            for name in names:
                print(f"scenario {name} ...", file=sys.stderr, flush=True)
                start = time.monotonic()
                scenario = asyncio.ensure_future(SCENARIOS[name](run))
                await asyncio.wait([scenario, supervisor], return_when=asyncio.FIRST_COMPLETED)
                if supervisor.done():
                    scenario.cancel()
                    supervisor.result()  # raises what stopped the supervision
                result = scenario.result()
                result.seconds = time.monotonic() - start
                result.blobs_left, result.rows_left = await leaks(run)
                print(f"  {_row(result)}", file=sys.stderr, flush=True)
                results.append(result)
        finally:
            supervisor.cancel()
    return results


HEADERS = ["scenario", "faults", "requests", "ok", "different", "lost", "refused (overload)",
           "hung", "blobs leaked", "rows leaked", "recovery p50 / max (s)", "wall (s)"]


def _row(result: Result) -> list[object]:
    tally = result.tally
    return [result.scenario, result.faults, tally.total, tally.ok, tally.different,
            tally.lost_line(), tally.refused, tally.hung, result.blobs_left, result.rows_left,
            result.recovery(), f"{result.seconds:.0f}"]


def _table(results: list[Result]) -> str:
    table = markdown_table(HEADERS, [_row(r) for r in results])
    examples = [f"- {r.scenario}, {code}: {message}" for r in results
                for code, message in r.tally.lost_examples.items()]
    if examples:
        table += "\n\nFirst message of each kind of lost request:\n\n" + "\n".join(examples)
    coded = [r for r in results if r.codes]
    for result in coded:
        table += "\n\n" + markdown_table(["request: status", "times"],
                                         sorted(result.codes.items()))
    return table
