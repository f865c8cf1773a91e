"""Engine decode/prefill speed vs transformers (writes docs/benchmarks.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.engine_bench import EngineBenchConfig, run_engine_bench
from bench.report import (
    command_line,
    fmt_ms,
    fmt_ratio,
    machine_line,
    markdown_table,
    publish,
)
from serving.settings import add_model_setting
from snapstream.engine import Engine
from snapstream.kvcache import kv_bytes_per_token


def register(parser: argparse.ArgumentParser) -> None:
    add_model_setting(parser)
    parser.add_argument("--contexts", default="1024,2048,4096,8192")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prefill-len", type=int, default=8192)
    parser.add_argument("--memory-limit-gib", type=float, default=14.0)
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--json-out", type=Path, default=None)


def run(args: argparse.Namespace) -> int:
    cfg = EngineBenchConfig(
        contexts=tuple(int(c) for c in args.contexts.split(",")),
        batches=tuple(int(b) for b in args.batches.split(",")), steps=args.steps,
        prefill_len=args.prefill_len, memory_limit_gib=args.memory_limit_gib,
        with_transformers=not args.no_transformers)
    engine = Engine.from_pretrained(args.model, dtype="float32")  # transformers gets its weights
    results = run_engine_bench(cfg, engine)
    publish(render(results, cfg, engine.config), "engine", args.doc, results, args.json_out)
    plot(results, args.doc.parent / "img" / "engine_decode_vs_context.png")
    return 0


def _decode_table(results: dict, kv_token: int, budget: int) -> str:
    rows = []
    for p in results["decode"]:
        rows.append([p["batch"], p["context"], fmt_ms(p["full_s"]), fmt_ms(p["snapstream_s"]),
                     fmt_ms(p["transformers_s"]),
                     fmt_ratio(p["snapstream_s"], p["snapstream_ref_s"]),
                     fmt_ratio(p["full_s"], p["snapstream_s"]),
                     fmt_ratio(p["transformers_s"], p["full_s"]),
                     f"{p['context'] * kv_token / 2**20:.1f}", f"{budget * kv_token / 2**20:.1f}"])
    return markdown_table(
        ["batch", "context", "full ms/step", "snapstream ms/step", "transformers ms/step",
         "snapstream / snapstream@shortest", "full / snapstream", "transformers / full",
         "full KV MiB/seq", "snapstream KV MiB/seq"],
        rows)


def target_lines(results: dict) -> list[str]:
    """The engine's four targets, each judged on same-run figures."""
    points = results["decode"]
    longest = max(p["context"] for p in points)
    const = [p["snapstream_s"] / p["snapstream_ref_s"] for p in points if p["context"] == longest]
    at_longest = [p["full_s"] / p["snapstream_s"] for p in points
                  if p["context"] == longest and p["batch"] == max(q["batch"] for q in points)
                  and p["full_s"]]
    versus = [(p["batch"], p["context"], p["transformers_s"] / p["full_s"]) for p in points
              if p["transformers_s"] and p["full_s"]]
    pre = results["prefill"]
    share = pre["ours_select_s"] / pre["ours_prefill_s"]
    worst = min(versus, key=lambda v: v[2]) if versus else None

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    return [
        f"- snapstream step at {longest} within 10% of the shortest context: "
        f"{', '.join(f'{r:.2f}×' for r in const)} — {verdict(all(r <= 1.1 for r in const))}",
        f"- full / snapstream ≥ 5 at {longest}, largest batch: "
        f"{', '.join(f'{r:.1f}×' for r in at_longest) or 'not measured'} — "
        f"{verdict(bool(at_longest) and all(r >= 5 for r in at_longest))}",
        f"- SnapKV selection ≤ 5% of prefill: {share:.1%} — {verdict(share <= 0.05)}",
        "- our full decode no slower than transformers at any point: worst "
        + (f"transformers/full = {worst[2]:.2f}× (batch {worst[0]}, context {worst[1]}) — "
           f"{verdict(worst[2] >= 1.0)}" if worst else "not measured"),
    ]


def render(results: dict, cfg, model_config) -> str:
    kv_token = kv_bytes_per_token(model_config, torch.float32)
    pre, comp = results["prefill"], results["compile"]
    hf_pre = pre.get("transformers_prefill_s")
    tokens = cfg.prefill_len
    lines = [
        "## Engine: decode step vs context, prefill, transformers baseline", "",
        f"Command: `{command_line()}`  ", f"Machine: {machine_line()}  ",
        f"Model: {results['model']}, {results['params'] / 1e6:.1f}M parameters, "
        f"{model_config.num_layers} layers, {model_config.num_heads} query / "
        f"{model_config.num_kv_heads} KV heads, head dim {model_config.head_dim}, float32 "
        "weights dequantized from the checkpoint. snapstream budget "
        f"{cfg.policy.budget} (n_sink={cfg.policy.n_sink}, n_topk={cfg.policy.n_topk}, "
        f"n_recent={cfg.policy.n_recent}). Median of {cfg.steps} steps after {cfg.warmup} "
        "warm-up steps; at each point the systems are stepped round-robin, so load from other "
        "processes falls on all of them alike. transformers: `LlamaForCausalLM` with its "
        "default `DynamicCache` "
        "pre-filled to the context, stepped as `generate` does. — = skipped: the KV cache "
        f"would exceed {cfg.memory_limit_gib} GiB.", "",
        _decode_table(results, kv_token, cfg.policy.budget), "",
        f"Prefill of {tokens} tokens (snapstream policy): ours "
        f"{tokens / pre['ours_prefill_s']:.0f} "
        f"tokens/s, SnapKV selection {pre['ours_select_s'] / pre['ours_prefill_s']:.1%} of "
        "prefill time" + (f"; transformers `generate(max_new_tokens=1)` "
                          f"{tokens / hf_pre:.0f} tokens/s" if hf_pre else "") + ".", "",
        "torch.compile of the decode step (snapstream layout, context 4096): " + ", ".join(
            f"batch {b}: eager {fmt_ms(comp[f'eager_b{b}_s'])} ms, compiled "
            f"{fmt_ms(comp[f'compiled_b{b}_s'])} ms "
            f"({fmt_ratio(comp[f'eager_b{b}_s'], comp[f'compiled_b{b}_s'])} speed-up)"
            for b in cfg.batches) + ".", "",
        "Targets:", "", *target_lines(results), "",
        "![decode step time ratios vs context](img/engine_decode_vs_context.png)",
    ]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({p["batch"] for p in results["decode"]})
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=True):
        points = [p for p in results["decode"] if p["batch"] == batch]
        # every ratio divides two timings of the same round (the machine's load cancels out)
        for key, label in (("full_s", "full (ours) / snapstream"),
                           ("transformers_s", "transformers DynamicCache / snapstream"),
                           ("snapstream_s", "snapstream / snapstream at the shortest context")):
            base = "snapstream_ref_s" if key == "snapstream_s" else "snapstream_s"
            xs = [p["context"] for p in points if p[key] is not None]
            ys = [p[key] / p[base] for p in points if p[key] is not None]
            ax.plot(xs, ys, marker="o", label=label)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set(xscale="log", yscale="log", xlabel="context (tokens)",
               ylabel="decode step time ratio", title=f"batch {batch}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
