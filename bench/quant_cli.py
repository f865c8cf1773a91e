"""Weight formats (float32, gguf, int8, int4): decode, prefill, RSS and parity (docs/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.quant_bench import QuantBenchConfig, run_quant_bench
from bench.report import (
    command_line,
    fmt_ms,
    fmt_ratio,
    machine_line,
    markdown_table,
    parse_ints,
    publish,
)
from serving.settings import add_model_setting


def register(parser: argparse.ArgumentParser) -> None:
    add_model_setting(parser)
    parser.add_argument("--formats", default="float32,gguf,int8,int4",
                        help="the first is the reference of ratios and parity")
    parser.add_argument("--threads", type=parse_ints, default=(1, 2),
                        help="torch thread counts, each measured in the same rounds")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-8k", action="store_true", help="skip batch 1 at 8192 tokens")
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--no-doc", action="store_true", help="print only")
    parser.add_argument("--json-out", type=Path, default=None)


def run(args: argparse.Namespace) -> int:
    defaults = QuantBenchConfig()
    decode = tuple(d for d in defaults.decode if not (args.no_8k and d.context > 4096))
    cfg = QuantBenchConfig(formats=tuple(args.formats.split(",")), threads=args.threads,
                           decode=decode, steps=args.steps)
    results = run_quant_bench(cfg, args.model)
    publish(render(results, command_line()), "levers", None if args.no_doc else args.doc,
            results, args.json_out)
    return 0


def _speed_cells(by_format: dict[str, float], formats: list[str]) -> list[str]:
    """ms of each format, and after each but the first its speed relative to the first."""
    base = by_format[formats[0]]
    cells = [fmt_ms(base)]
    for fmt in formats[1:]:
        cells += [fmt_ms(by_format[fmt]), fmt_ratio(base, by_format[fmt])]
    return cells


def render(results: dict, command: str) -> str:
    cfg = results["config"]
    formats, ref = list(cfg["formats"]), cfg["formats"][0]
    head = [f"{ref} ms"] + [c for fmt in formats[1:] for c in (f"{fmt} ms", f"{fmt} speed")]
    decode: dict[tuple, dict[str, float]] = {}
    for row in results["decode"]:
        key = (row["batch"], row["context"], row["cache"], row["threads"])
        decode.setdefault(key, {})[row["format"]] = row["step_s"]
    decode_rows = [[b, c, "model policy (1024 slots)" if cache == "model" else "full", t,
                    *_speed_cells(v, formats)] for (b, c, cache, t), v in decode.items()]
    prefill: dict[int, dict[str, float]] = {}
    for row in results["prefill"]:
        prefill.setdefault(row["threads"], {})[row["format"]] = row["prefill_s"]
    prefill_rows = [[t, *(f"{cfg['prefill_len'] / v[fmt]:.0f}" for fmt in formats),
                     *(fmt_ratio(v[ref], v[fmt]) for fmt in formats[1:])]
                    for t, v in prefill.items()]
    rss = results["rss"]
    rss_rows = [[fmt, f"{rss[fmt]['peak_mib']:.0f}", f"{rss[fmt]['final_mib']:.0f}",
                 fmt_ratio(rss[fmt]["final_mib"], rss[ref]["final_mib"])] for fmt in formats]
    parity = results["parity"]
    n_chat = len(parity[ref]["chat_outputs"])
    n_found = len(parity[ref]["retrieval_found"])
    parity_rows = [[fmt, f"{parity[fmt]['identical']}/{n_chat}",
                    ", ".join(map(str, parity[fmt]["first_diff"])),
                    f"{sum(parity[fmt]['retrieval_found'])}/{n_found}",
                    f"{parity[fmt]['forced_top1']:.3f}", f"{parity[fmt]['forced_kl']:.4f}"]
                   for fmt in formats]
    return "\n\n".join([
        f"### Weight formats: {' vs '.join(formats)}",
        f"`{command}` — model {results['model']}; {machine_line()} (by default; each row "
        f"says the threads it ran with, parity ran with {cfg['threads'][0]}); load average "
        f"(1, 5, 15 min) {results['loadavg'][0]} at the start, {results['loadavg'][1]} at the "
        "end. Every (format, threads) pair is stepped round-robin in one process; medians of "
        f"{cfg['steps']} steps; speed = {ref} time / format time.",
        "Decode step (ms; batch 1: ms/token):",
        markdown_table(["batch", "context", "cache", "threads", *head], decode_rows),
        f"Prefill of a {cfg['prefill_len']}-token prompt (tokens/s, median of "
        f"{cfg['prefill_rounds']} rounds):",
        markdown_table(["threads", *(f"{fmt} tok/s" for fmt in formats),
                        *(f"{fmt} speed" for fmt in formats[1:])], prefill_rows),
        f"RSS (MiB; one fresh process per format: load, prefill {cfg['prefill_len']} tokens, "
        "decode 16; peak includes the float32 weights every format loads first):",
        markdown_table(["format", "peak", "after generating", f"/ {ref}"], rss_rows),
        f"Greedy parity with {ref} ({cfg['parity_tokens']} tokens on {n_chat} chat prompts; "
        f"first differing token index, {cfg['parity_tokens']} = identical) and retrieval "
        f"({'/'.join(cfg['retrieval_tasks'])} at {cfg['retrieval_len']} tokens, depths "
        f"{', '.join(map(str, cfg['retrieval_depths']))}, the model's policy); teacher-forced "
        f"over the first two retrieval prompts: top-1 agreement with {ref} and KL({ref} ‖ "
        "format) per token:",
        markdown_table(["format", "chat identical", "first difference", "answer found",
                        "forced top-1", "forced KL"], parity_rows),
    ])

