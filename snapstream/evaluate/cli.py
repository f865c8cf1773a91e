"""`snapstream eval`: RULER-style retrieval accuracy per cache policy and budget.

Writes results.csv, summary.json, accuracy_vs_budget.png and heatmap_<policy>.png into --out
and prints a summary table. Budgets: fractions of each sample's context length (``1/4``) or
token counts (``256``), split into sinks, SnapKV picks and ring by the rule in
:mod:`snapstream.evaluate.budget`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from snapstream.evaluate.budget import Budget, SplitRule
from snapstream.evaluate.config import EvalConfig
from snapstream.policy import POOLINGS, CachePolicy


def _list_of(convert: Callable, what: str) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(convert(part.strip()) for part in text.split(",") if part.strip())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}: {exc}") from None
    return parse


def register(parser: argparse.ArgumentParser) -> None:
    d, rule = EvalConfig(), SplitRule()
    add = parser.add_argument
    add("--model", default=None, help="checkpoint directory (default: the embedded model)")
    add("--dtype", choices=("float32", "bfloat16"), default="float32")
    add("--device", default="cpu")
    add("--tasks", type=_list_of(str, "task names"), default=d.tasks)
    add("--context-lens", type=_list_of(int, "integers"), default=d.context_lens)
    add("--depths", type=_list_of(float, "numbers in [0, 1]"), default=d.depths)
    add("--placements", type=_list_of(str, "placements"), default=tuple(map(str, d.placements)),
        help="after: question after the context; before: question-agnostic compression")
    add("--policies", type=_list_of(str, "policy names"), default=d.policies)
    add("--budgets", type=_list_of(Budget.parse, "budgets"), default=d.budgets,
        help="fractions of the context (1/4, 0.25) or token counts (256)")
    add("--n-per-cell", type=int, default=d.n_per_cell)
    add("--seed", type=int, default=d.seed)
    add("--split", default=str(d.split), help="train or heldout filler and phrasings")
    add("--num-distractors", type=int, default=d.num_distractors)
    add("--num-hops", type=int, default=d.num_hops)
    add("--max-new-tokens", type=int, default=d.max_new_tokens)
    add("--gap-tokens", type=int, default=d.gap_tokens,
        help="filler decoded between the question and the answer cue as if generated "
        "(placements=after only)")
    add("--n-sink", type=int, default=rule.n_sink)
    add("--window", type=int, default=rule.window)
    add("--recent-fraction", type=float, default=rule.recent_fraction,
        help="share of the budget for the recent ring (at least --window tokens)")
    add("--kernel", type=int, default=None, help="SnapKV pooling kernel (default: the model's)")
    add("--pooling", choices=POOLINGS, default=None, help="(default: the model's)")
    add("--limit", type=int, default=None, help="evaluate only N samples spread over the grid")
    add("--out", type=Path, default=Path("eval_results"), help="output directory")
    add("--no-progress", action="store_true", help="hide the progress bar")


def config_from_args(args: argparse.Namespace, model_policy: CachePolicy) -> EvalConfig:
    """``model_policy``: the model's default policy, whose SnapKV pooling unset flags keep."""
    rule = SplitRule(n_sink=args.n_sink, window=args.window,
                     recent_fraction=args.recent_fraction,
                     kernel=model_policy.kernel if args.kernel is None else args.kernel,
                     pooling=model_policy.pooling if args.pooling is None else args.pooling)
    return EvalConfig(
        tasks=args.tasks, context_lens=args.context_lens, depths=args.depths,
        placements=args.placements, policies=args.policies, budgets=args.budgets,
        n_per_cell=args.n_per_cell, seed=args.seed, split=args.split,
        num_distractors=args.num_distractors, num_hops=args.num_hops,
        max_new_tokens=args.max_new_tokens, gap_tokens=args.gap_tokens, split_rule=rule,
        limit=args.limit)


def run(args: argparse.Namespace) -> int:
    from snapstream.evaluate.plots import plot_accuracy_vs_budget, plot_heatmaps
    from snapstream.evaluate.results import summarize, summary_table, write_csv
    from snapstream.evaluate.runner import evaluate
    from snapstream.evaluate.shared_prefill import SharedPrefillEngine

    engine = SharedPrefillEngine.from_pretrained(args.model, dtype=args.dtype,
                                                 device=args.device)
    cfg = config_from_args(args, engine.default_policy)
    overhead = len(engine.tokenizer.encode("")) + cfg.gap_tokens  # e.g. BOS, and the gap
    if max(cfg.context_lens) + overhead > engine.context_len:
        raise ValueError(f"context_lens: {max(cfg.context_lens)} + {overhead} token(s) of BOS "
                         f"and gap exceeds the model's context of {engine.context_len}; use at "
                         f"most {engine.context_len - overhead}")
    rows = evaluate(engine, cfg, cfg.samples(), progress=not args.no_progress)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "results.csv")
    model = str(args.model) if args.model else "embedded"
    summary = summarize(rows, config=cfg.to_json(), model=model)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    placements = summary["config"]["placements"]
    plot_accuracy_vs_budget(summary["overall"], placements, out / "accuracy_vs_budget.png")
    plot_heatmaps(rows, placements, out)
    print(summary_table(summary))
    print(f"wrote {len(rows)} rows and figures to {out}")
    return 0
