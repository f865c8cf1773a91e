"""The cache-policy sweep that picks a model's default SnapKV settings.

``python -m snapstream.evaluate.sweep --out DIR [--write-policy]`` evaluates ``snapstream`` on
one sample grid (shared forwards) at budgets 1/4 and 1/8 under rules that vary one axis at a
time around ``BASE``: every kernel with every pooling, then the window, the sinks and the
ring's share of the budget. The chosen rule takes each axis's best value (ties go to the
base's), so it assumes the axes act independently; the evaluation grid then checks the
choice. ``--write-policy`` writes it as the model's policy file (a 1024-token budget split by
the chosen rule), which :func:`~snapstream.policy.load_default_policy` reads.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from snapstream.evaluate.budget import Budget, SplitRule
from snapstream.evaluate.config import EvalConfig, Run
from snapstream.evaluate.results import Row

BASE = SplitRule(n_sink=4, window=32, recent_fraction=0.25, kernel=7, pooling="avg")
AXES: dict[str, tuple] = {
    "kernel": (1, 3, 7, 15, 31, 63),
    "pooling": ("avg", "max"),
    "window": (16, 32, 64, 128),
    "n_sink": (0, 4, 16, 64),
    "recent_fraction": (0.0, 0.125, 0.25, 0.5),
}
BUDGETS = ("1/4", "1/8")
SERVING_BUDGET = 1024


@dataclass(frozen=True)
class Variant:
    axis: str  # "kernel x pooling" or one of AXES
    rule: SplitRule


def variants(base: SplitRule = BASE) -> list[Variant]:
    """Every kernel x pooling, then each other axis alone around ``base``."""
    found = [Variant("kernel x pooling", replace(base, kernel=k, pooling=p))
             for p in AXES["pooling"] for k in AXES["kernel"]]
    for axis in ("window", "n_sink", "recent_fraction"):
        found += [Variant(axis, replace(base, **{axis: value})) for value in AXES[axis]]
    return found


def sweep_runs(cfg: EvalConfig, context_len: int) -> list[Run]:
    """``full`` and every distinct variant's ``snapstream`` policy at each budget."""
    runs = [Run(BASE.policy("full", 0), None, None)]
    for label in BUDGETS:
        budget = Budget.parse(label)
        tokens = budget.tokens_for(context_len)
        policies = dict.fromkeys(v.rule.policy("snapstream", tokens) for v in variants())
        runs += [Run(policy, budget, tokens) for policy in policies]
    return runs


def _accuracy(rows: list[Row], rule: SplitRule, label: str) -> float:
    matches = [row.correct for row in rows if row.budget_label == label
               and rule.policy("snapstream", row.budget) == _policy_of(row)]
    return sum(matches) / len(matches)


def _policy_of(row: Row):
    from snapstream.policy import CachePolicy

    return CachePolicy(kind=row.policy, n_sink=row.n_sink, n_topk=row.n_topk,
                       n_recent=row.n_recent, window=row.window, kernel=row.kernel,
                       pooling=row.pooling)


def tabulate(rows: list[Row]) -> list[dict]:
    """Accuracy of every variant at every budget and their mean."""
    budgeted = [row for row in rows if row.budget_label]
    table = []
    for variant in variants():
        scores = {label: _accuracy(budgeted, variant.rule, label) for label in BUDGETS}
        table.append({"axis": variant.axis, **asdict(variant.rule), **scores,
                      "mean": sum(scores.values()) / len(scores)})
    return table


def choose(table: list[dict]) -> SplitRule:
    """Each axis's best value by mean accuracy over the budgets (ties: the base's value)."""
    best: dict[str, object] = {}
    by_axis: dict[str, list[dict]] = defaultdict(list)
    for entry in table:
        by_axis[entry["axis"]].append(entry)
    top = max(by_axis["kernel x pooling"],
              key=lambda e: (e["mean"], e["kernel"] == BASE.kernel, e["pooling"] == BASE.pooling))
    best.update(kernel=top["kernel"], pooling=top["pooling"])
    for axis in ("window", "n_sink", "recent_fraction"):
        top = max(by_axis[axis], key=lambda e, a=axis: (e["mean"], e[a] == getattr(BASE, a)))
        best[axis] = top[axis]
    return replace(BASE, **best)


def policy_fields(rule: SplitRule) -> dict:
    """The policy file's fields: ``snapstream`` at the serving budget, split by ``rule``."""
    policy = rule.policy("snapstream", SERVING_BUDGET)
    return {"kind": policy.kind, "n_sink": policy.n_sink, "n_topk": policy.n_topk,
            "n_recent": policy.n_recent, "window": policy.window, "kernel": policy.kernel,
            "pooling": policy.pooling}


def main(argv: list[str] | None = None) -> int:
    from snapstream.checkpoints import open_checkpoint
    from snapstream.engine import Engine
    from snapstream.evaluate.cli import write_outputs
    from snapstream.evaluate.runner import evaluate
    from snapstream.evaluate.sweep_plot import plot_sweep

    args = _parser().parse_args(argv)
    cfg = EvalConfig(tasks=tuple(args.tasks.split(",")), context_lens=(args.context_len,),
                     placements=("after",), policies=("full", "snapstream"),
                     n_per_cell=args.n_per_cell, seed=args.seed)
    engine = Engine.from_pretrained(args.model)
    rows = evaluate(engine, cfg, cfg.samples(engine.tokenizer),
                    runs_for=lambda n: sweep_runs(cfg, n))
    write_outputs(rows, cfg.to_json(), str(args.model or engine.name), args.out)
    table = tabulate(rows)
    chosen = choose(table)
    result = {"base": asdict(BASE), "chosen": asdict(chosen), "policy": policy_fields(chosen),
              "table": table}
    (args.out / "sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    plot_sweep(table, BASE, chosen, args.out / "sweep.png")
    print(json.dumps(result["policy"]))
    if args.write_policy:
        path = open_checkpoint(args.model).policy_file
        path.write_text(json.dumps(result["policy"], indent=1) + "\n")
        print(f"wrote the model's default policy to {path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m snapstream.evaluate.sweep",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help=".gguf file or checkpoint directory")
    parser.add_argument("--tasks", default="niah,multikey,kv,vartrack,realtext")
    parser.add_argument("--context-len", type=int, default=2048)
    parser.add_argument("--n-per-cell", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--write-policy", action="store_true",
                        help="write the chosen policy as the model's policy file")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
