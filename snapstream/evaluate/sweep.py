"""The cache-policy sweep that picks a model's default SnapKV settings.

``python -m snapstream.evaluate.sweep --out DIR [--write-policy]`` evaluates ``snapstream`` on
one sample grid at budgets 1/4 and 1/8 in two stages that share the prompts' forwards: first
every kernel with every pooling around ``BASE``; then, around the best of those, the window,
the sinks and the ring's share of the budget, one axis at a time. The chosen rule takes each
axis's best value (ties go to the centre's), so it assumes the last three axes act
independently; the evaluation grid then checks the choice. ``--write-policy`` writes it as the
model's policy file (a 1024-token budget split by the chosen rule), which
:func:`~snapstream.policy.load_default_policy` reads.
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
    axis: str  # KERNEL_AXIS or one of OTHER_AXES
    rule: SplitRule


KERNEL_AXIS = "kernel x pooling"
OTHER_AXES = ("window", "n_sink", "recent_fraction")


def kernel_variants(base: SplitRule = BASE) -> list[Variant]:
    """Every kernel x pooling, the other axes at ``base``."""
    return [Variant(KERNEL_AXIS, replace(base, kernel=k, pooling=p))
            for p in AXES["pooling"] for k in AXES["kernel"]]


def axis_variants(centre: SplitRule) -> list[Variant]:
    """Each of ``OTHER_AXES`` alone around ``centre``."""
    return [Variant(axis, replace(centre, **{axis: value}))
            for axis in OTHER_AXES for value in AXES[axis]]


def variants(base: SplitRule = BASE) -> list[Variant]:
    """Both stages' variants when the second is centred on ``base``."""
    return kernel_variants(base) + axis_variants(base)


def sweep_runs(found: list[Variant], context_len: int, with_full: bool = True,
               skip: frozenset = frozenset()) -> list[Run]:
    """``full`` (when ``with_full``) and every distinct variant's ``snapstream`` policy at each
    budget, less the policies in ``skip`` (decoded already)."""
    runs = [Run(BASE.policy("full", 0), None, None)] if with_full else []
    for label in BUDGETS:
        budget = Budget.parse(label)
        tokens = budget.tokens_for(context_len)
        policies = dict.fromkeys(v.rule.policy("snapstream", tokens) for v in found)
        runs += [Run(policy, budget, tokens) for policy in policies if policy not in skip]
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


def tabulate(rows: list[Row], found: list[Variant]) -> list[dict]:
    """Accuracy of every variant in ``found`` at every budget and their mean."""
    budgeted = [row for row in rows if row.budget_label]
    table = []
    for variant in found:
        scores = {label: _accuracy(budgeted, variant.rule, label) for label in BUDGETS}
        table.append({"axis": variant.axis, **asdict(variant.rule), **scores,
                      "mean": sum(scores.values()) / len(scores)})
    return table


def choose_kernel(table: list[dict]) -> SplitRule:
    """The best kernel x pooling by mean accuracy over the budgets (ties: the base's)."""
    top = max((e for e in table if e["axis"] == KERNEL_AXIS),
              key=lambda e: (e["mean"], e["kernel"] == BASE.kernel, e["pooling"] == BASE.pooling))
    return replace(BASE, kernel=top["kernel"], pooling=top["pooling"])


def choose(table: list[dict]) -> SplitRule:
    """The best kernel x pooling, then each other axis's best value (ties: the base's)."""
    best: dict[str, object] = {}
    by_axis: dict[str, list[dict]] = defaultdict(list)
    for entry in table:
        by_axis[entry["axis"]].append(entry)
    for axis in OTHER_AXES:
        top = max(by_axis[axis], key=lambda e, a=axis: (e["mean"], e[a] == getattr(BASE, a)))
        best[axis] = top[axis]
    return replace(choose_kernel(table), **best)


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
                     n_per_cell=args.n_per_cell, seed=args.seed,
                     prompt_format=args.prompt_format, max_group_tokens=args.max_group_tokens)
    engine = Engine.from_pretrained(args.model)
    samples = cfg.samples(engine.tokenizer)
    forwards: dict = {}  # shared by both stages
    first = kernel_variants()
    rows = evaluate(engine, cfg, samples, runs_for=lambda n: sweep_runs(first, n),
                    forwards=forwards, max_window=max(AXES["window"]))
    table = tabulate(rows, first)
    centre = choose_kernel(table)
    print(f"stage 2: window, sinks and ring share around {centre}", flush=True)
    second = axis_variants(centre)
    done = frozenset(_policy_of(row) for row in rows)
    rows += evaluate(engine, cfg, samples, forwards=forwards,
                     runs_for=lambda n: sweep_runs(second, n, with_full=False, skip=done))
    table += tabulate(rows, second)
    write_outputs(rows, cfg.to_json(), str(args.model or engine.name), args.out)
    chosen = choose(table)
    full = [row.correct for row in rows if row.policy == "full"]
    result = {"base": asdict(BASE), "centre": asdict(centre), "chosen": asdict(chosen),
              "policy": policy_fields(chosen), "full_accuracy": sum(full) / len(full),
              "table": table}
    (args.out / "sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    plot_sweep(table, centre, chosen, result["full_accuracy"], args.out / "sweep.png")
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
    parser.add_argument("--prompt-format", choices=("chat", "raw"), default="chat")
    parser.add_argument("--max-group-tokens", type=int, default=16384,
                        help="prompt tokens decoded together (and held at once per group)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--write-policy", action="store_true",
                        help="write the chosen policy as the model's policy file")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
