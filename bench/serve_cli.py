"""Serving through the router vs the in-process engine, and KV blob transfer (writes
docs/benchmarks.md)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace
from pathlib import Path

from bench import serve_compare, serve_report
from bench.blob_bench import BlobBenchConfig, run_blob_bench
from bench.report import command_line, parse_ints, parse_names, publish
from bench.serve_bench import run_serve_bench
from bench.serve_doccache import render, run_doccache_bench
from bench.serve_report import image_name, plot
from bench.serve_workload import DEFAULT_SYSTEMS, ServeBenchConfig, Slo
from cluster import STORE_SERVERS
from serving.settings import add_model_setting

PARTS = ("serve", "blob")
WORKLOADS = ("passkey", "doccache")


def register(parser: argparse.ArgumentParser) -> None:
    add_model_setting(parser)
    parser.add_argument("--parts", type=parse_names, default=PARTS, help="serve,blob")
    parser.add_argument("--workload", choices=WORKLOADS, default=WORKLOADS[0],
                        help="passkey: one prompt per request, every system; doccache: "
                        "--documents documents asked many questions each through the router, "
                        "each document marked reusable (its own section)")
    parser.add_argument("--documents", type=int, default=2,
                        help="documents of the doccache workload (each asked requests / "
                        "documents questions per level)")
    parser.add_argument("--systems", type=parse_names, default=None,
                        help="systems to measure, the first being the baseline: in-process, "
                        "router (gRPC), openai (an OpenAI-compatible server); default "
                        "in-process,router; others get a section of their own")
    parser.add_argument("--openai-url", default=None,
                        help="base URL (http://HOST:PORT/v1) of the OpenAI-compatible server "
                        "the openai system drives (default: the local cluster's router)")
    parser.add_argument("--concurrency", type=parse_ints, default=(1, 8, 32))
    parser.add_argument("--requests", type=parse_ints, default=(16, 32, 64),
                        help="requests sent at each concurrency level")
    parser.add_argument("--prompt-len", type=int, default=1500, help="prompt bytes")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rows", type=int, default=32,
                        help="rows of the decode worker's batch and of the in-process loop's")
    parser.add_argument("--stores", type=parse_names, default=("redis", "nats"),
                        help="KV stores: the serving part runs once per store, each run with "
                        "its own in-process baseline")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch threads of the in-process engine and of each cluster "
                        "worker (0: torch's default, one per core)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each level per system, alternating which goes first")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    parser.add_argument("--slo-itl-p90-ms", type=float, default=250.0)
    parser.add_argument("--blob-stores", type=parse_names, default=("redis", "nats"))
    parser.add_argument("--blob-sizes-mib", type=parse_ints, default=(1, 64, 1024))
    parser.add_argument("--blob-repeats", type=int, default=3)
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--json-out", type=Path, default=None)


def run(args: argparse.Namespace) -> int:
    unknown = set(args.parts) - set(PARTS)
    if unknown or not args.parts:
        raise ValueError(f"--parts: choose from {', '.join(PARTS)}, got {','.join(args.parts)}")

    if not args.stores or set(args.stores) - set(STORE_SERVERS):
        raise ValueError(f"--stores: choose from {', '.join(STORE_SERVERS)}, got "
                         f"{','.join(args.stores)}")

    cfg = serve_config(args)
    if args.workload == "doccache":
        return _run_doccache(args, cfg)
    is_default = cfg.systems == DEFAULT_SYSTEMS
    if "blob" in args.parts and not is_default:
        raise ValueError("--parts blob goes with the default --systems "
                         f"{','.join(DEFAULT_SYSTEMS)}; measure other systems with --parts serve")

    results = {}
    if "serve" in args.parts:
        results["serve"] = [run_serve_bench(replace(cfg, store=store), args.model)
                            for store in args.stores]
    if "blob" in args.parts:
        points = run_blob_bench(BlobBenchConfig(
            stores=args.blob_stores, sizes=tuple(s * 2**20 for s in args.blob_sizes_mib),
            repeats=args.blob_repeats))
        results["blob"] = [asdict(point) for point in points]
    section, body = _render(results, cfg.systems, is_default)
    publish(body, section, args.doc, results, args.json_out)
    for serve in results.get("serve", []):
        plot(serve, args.doc.parent / "img" / image_name(section, serve))
    return 0


def _run_doccache(args: argparse.Namespace, cfg) -> int:
    if args.parts != ("serve",) or args.systems not in (None, ("router",)):
        raise ValueError("--workload doccache measures the router's document cache: give "
                         "--parts serve and no --systems other than router")
    if args.documents < 1:
        raise ValueError(f"--documents must be >= 1, got {args.documents}")
    results = run_doccache_bench(cfg, args.model, args.documents)
    publish(render(results, command_line()), "serve-doccache", args.doc, results,
            args.json_out)
    return 0


def _render(results: dict, systems: tuple[str, ...], is_default: bool) -> tuple[str, str]:
    """-> (section of docs/benchmarks.md, its text): the default systems and the blob
    transfer in ``serve``; other systems in a section named after them."""
    is_default = is_default or "serve" not in results
    section = "serve" if is_default else serve_compare.section_name(systems)
    if is_default:
        return section, serve_report.render(results, section)
    return section, serve_compare.render(results["serve"], section)


def serve_config(args: argparse.Namespace):
    return ServeBenchConfig(
        concurrency=args.concurrency, requests=args.requests, prompt_len=args.prompt_len,
        max_new_tokens=args.max_new_tokens, rows=args.rows, store=args.stores[0],
        torch_threads=args.torch_threads,
        rounds=args.rounds, warmup=args.warmup,
        systems=args.systems or ServeBenchConfig.systems, openai_url=args.openai_url,
        slo=Slo(ttft_s=args.slo_ttft_ms / 1e3, itl_p90_s=args.slo_itl_p90_ms / 1e3))
