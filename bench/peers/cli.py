"""Peers (llama.cpp, OpenVINO GenAI, transformers, kvpress) on the same CPU, model and tokens.

Builds each peer's venv on first use (cached; llama.cpp compiles for ~15-30 min) and writes the
tables into the ``peers`` section of docs/benchmarks.md (``peers-<model>`` for a ``--model``
other than the default): ``--parts batch1`` (every system, one request at a time), ``serve``
(snapstream's serving loop against llama-server under concurrency, prefill included) and
``batch`` (decode throughput with c sequences at once); ``passkey`` (retrieval on 8 prompts per
system, answers only) writes ``peers-passkey`` (``peers-<model>-passkey``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from dataclasses import replace
from pathlib import Path

from bench.peers.batch import PeersBatchConfig, render_batch, run_peers_batch
from bench.peers.bench import PeersBenchConfig, _stderr, run_peers_bench
from bench.peers.passkey import (
    PeersPasskeyConfig,
    render_passkey,
    run_peers_passkey,
)
from bench.peers.peer_model import peer_model
from bench.peers.report import render
from bench.peers.serve import PeersServeConfig, render_serve, run_peers_serve
from bench.report import command_line, write_section
from serving.settings import add_model_setting


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def _max_lengths(text: str) -> tuple[tuple[str, int], ...]:
    pairs = [part.split("=") for part in text.split(",") if part]
    if any(len(pair) != 2 or not pair[1].isdigit() for pair in pairs):
        raise ValueError(f"--max-length: give SYSTEM=TOKENS,..., got {text!r}")
    return tuple((name, int(tokens)) for name, tokens in pairs)


PARTS = ("batch1", "serve", "batch", "passkey")


def register(parser: argparse.ArgumentParser) -> None:
    defaults, serve, batch = PeersBenchConfig(), PeersServeConfig(), PeersBatchConfig()
    add_model_setting(parser)
    parser.add_argument("--parts", default=",".join(PARTS), help=",".join(PARTS))
    parser.add_argument("--systems", default=",".join(defaults.systems),
                        help="comma-separated registered systems")
    parser.add_argument("--lengths", default=",".join(map(str, defaults.lengths)),
                        help="prompt lengths in tokens")
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--max-length", default="",
                        help="SYSTEM=TOKENS,...: no longer prompts for that system in the batch1 "
                             "part (the table says so), e.g. transformers=8192")
    parser.add_argument("--threads", type=int, default=defaults.n_threads)
    parser.add_argument("--budget", type=int, default=None,
                        help="KV budget in tokens of the compressing systems (default: the "
                             "model's policy; their recent ring the share of it the model's "
                             "policy gives its ring)")
    parser.add_argument("--baseline", default="llama.cpp", help="system the ratios divide by")
    parser.add_argument("--serve-concurrency", default=",".join(map(str, serve.concurrency)))
    parser.add_argument("--serve-requests", default=",".join(map(str, serve.requests)),
                        help="requests at each --serve-concurrency")
    parser.add_argument("--serve-prompt-len", type=int, default=serve.prompt_len,
                        help="tokens of the serve part's prompts")
    parser.add_argument("--batch-systems", default=",".join(batch.systems),
                        help="systems of the batch part")
    parser.add_argument("--batch-concurrency", default=",".join(map(str, batch.concurrency)))
    parser.add_argument("--batch-new-tokens", type=int, default=batch.max_new_tokens,
                        help="new tokens per sequence in the batch part")
    parser.add_argument("--batch-timeout", type=float, default=batch.timeout_s,
                        help="seconds a system may take to start or to finish one batch (c "
                             "long prompts on 2 cores take most of an hour)")
    parser.add_argument("--batch-shared-prompt", action="store_true",
                        help="one prompt for every sequence of the batch part, prefilled once "
                             "where the system can: one long prefill instead of c")
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--json-out", type=Path, default=None)


def run(args: argparse.Namespace) -> int:
    parts = tuple(args.parts.split(","))
    if not parts or set(parts) - set(PARTS):
        raise ValueError(f"--parts: choose from {','.join(PARTS)}, got {args.parts}")
    model = peer_model(args.model)
    budget = model.budget if args.budget is None else replace(
        model.budget, total=args.budget, n_recent=max(
            model.budget.observation,
            round(args.budget * model.budget.n_recent / model.budget.total)))
    cfg = PeersBenchConfig(
        systems=tuple(args.systems.split(",")), lengths=_ints(args.lengths),
        max_new_tokens=args.max_new_tokens, rounds=args.rounds, n_threads=args.threads,
        model=args.model, budget=budget, max_lengths=_max_lengths(args.max_length))
    serve_cfg = PeersServeConfig(
        concurrency=_ints(args.serve_concurrency), requests=_ints(args.serve_requests),
        prompt_len=args.serve_prompt_len, max_new_tokens=args.max_new_tokens,
        rounds=args.rounds, n_threads=args.threads, model=args.model)
    batch_cfg = PeersBatchConfig(
        systems=tuple(args.batch_systems.split(",")),
        concurrency=_ints(args.batch_concurrency), prompt_len=args.serve_prompt_len,
        max_new_tokens=args.batch_new_tokens, rounds=args.rounds, n_threads=args.threads,
        model=args.model, budget=budget, timeout_s=args.batch_timeout,
        shared_prompt=args.batch_shared_prompt)
    # SIGTERM unwinds like Ctrl-C, so the runners get stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, dict] = {}
    # doc section -> tables (the batch and passkey parts: sections of their own, so that a run
    # of one part leaves the others' tables as they are)
    tables, batch_tables = model.section(), model.section("batch")
    passkey_tables = model.section("passkey")
    bodies: dict[str, list[str]] = {tables: [], batch_tables: [], passkey_tables: []}
    if "batch1" in parts:
        results["batch1"] = run_peers_bench(cfg)
        bodies[tables].append(render(results["batch1"], cfg, args.baseline))
    if "serve" in parts:
        results["serve"] = run_peers_serve(serve_cfg, _stderr)
        bodies[tables].append(render_serve(results["serve"], serve_cfg))
    if "batch" in parts:
        results["batch"] = run_peers_batch(batch_cfg)
        bodies[batch_tables].append(render_batch(results["batch"], batch_cfg, args.baseline))
    if "passkey" in parts:
        passkey_cfg = PeersPasskeyConfig(systems=cfg.systems, prompt_len=args.serve_prompt_len,
                                         n_threads=args.threads, model=args.model, budget=budget)
        results["passkey"] = run_peers_passkey(passkey_cfg)
        bodies[passkey_tables].append(render_passkey(results["passkey"], passkey_cfg,
                                                       command_line()))
    for section, tables in bodies.items():
        if tables:
            body = "\n\n".join(tables)
            print(body)
            write_section(args.doc, section, body)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(results, indent=1))
    return 0
