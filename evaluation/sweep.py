"""The cache-policy sweep that picks a model's default SnapKV settings.

``python -m evaluation.sweep --out DIR [--write-policy]`` evaluates ``snapstream`` on
one sample grid at budgets 1/4 and 1/8, in stages that share the prompts' forwards: first every
kernel with every pooling around ``BASE``; then rounds of coordinate descent around the best so
far: the kernel, the observation window, the sinks and the ring's share of the budget, one axis
at a time,
the next round centred on the last round's pick of each axis (ties go to the centre's), until
the pick is its own centre or ``MAX_ROUNDS`` have run. Those answers come right after the
prompt, where the sinks and the ring only take slots from SnapKV; a last stage, on prompts
answered after ``GEN_GAPS`` generated tokens (question after, one length), picks the sinks and
the ring's share around the descent's choice: of the values within ``GEN_SLACK`` answers (over
every gap) of the best, the one under which the model best predicts the generated text (the
lowest mean negative log-likelihood of the gaps' tokens), since the ring is all it keeps of
its own output and the answers alone do not see that. The evaluation grid then checks the
choice. ``--write-policy`` writes it as the model's policy file (a
1024-token budget split by the chosen rule; the file's fields the sweep does not search are
kept), which :func:`~snapstream.policy.load_default_policy` reads.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench.report import parse_ints
from evaldata import PROMPT_FORMATS, model_format
from evaluation.budget import Budget, SplitRule
from evaluation.cli import write_outputs
from evaluation.config import EvalConfig, Run
from evaluation.results import Row, accuracy_table
from evaluation.runner import evaluate
from evaluation.sweep_plot import plot_sweep
from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.registry import MODEL_HELP
from snapstream.engine import Engine
from snapstream.policy import CachePolicy

BASE = SplitRule(n_sink=4, observation=32, recent_fraction=0.25, kernel=7, pooling="avg")
AXES: dict[str, tuple] = {
    "kernel": (1, 3, 7, 15, 31, 63),
    "pooling": ("avg", "max"),
    "observation": (4, 8, 16, 32, 64, 128),
    "n_sink": (0, 4, 16, 64),
    "recent_fraction": (0.0, 0.125, 0.25, 0.5),
}
BUDGETS = ("1/4", "1/8")
SERVING_BUDGET = 1024
MAX_ROUNDS = 3
# the last stage: what decode keeps besides SnapKV's picks, scored after long generations
GEN_AXES = ("n_sink", "recent_fraction")
GEN_GAPS = (0, 128, 512)
GEN_CONTEXT_LEN = 2048
GEN_SLACK = 1  # answers (over every gap and budget) a better-predicted generation may give up


@dataclass(frozen=True)
class Variant:
    axis: str  # KERNEL_AXIS or one of ROUND_AXES (GEN_AXES in the last stage)
    rule: SplitRule


KERNEL_AXIS = "kernel x pooling"
ROUND_AXES = ("kernel", "observation", "n_sink", "recent_fraction")


def kernel_variants(base: SplitRule = BASE) -> list[Variant]:
    """Every kernel x pooling, the other axes at ``base``."""
    return [Variant(KERNEL_AXIS, replace(base, kernel=k, pooling=p))
            for p in AXES["pooling"] for k in AXES["kernel"]]


def axis_variants(centre: SplitRule) -> list[Variant]:
    """Each of ``ROUND_AXES`` alone around ``centre`` (the kernel at the centre's pooling)."""
    return [Variant(axis, replace(centre, **{axis: value}))
            for axis in ROUND_AXES for value in AXES[axis]]


def generation_variants(centre: SplitRule) -> list[Variant]:
    """Each of ``GEN_AXES`` alone around ``centre``."""
    return [Variant(axis, replace(centre, **{axis: value}))
            for axis in GEN_AXES for value in AXES[axis]]


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


def _rows_of(rows: list[Row], rule: SplitRule, label: str) -> list[Row]:
    """``rule``'s rows at budget ``label``."""
    return [row for row in rows if row.budget_label == label
            and rule.policy("snapstream", row.budget) == _policy_of(row)]


def _policy_of(row: Row):
    return CachePolicy(kind=row.policy, n_sink=row.n_sink, n_topk=row.n_topk,
                       n_recent=row.n_recent, observation=row.observation, kernel=row.kernel,
                       pooling=row.pooling)


def tabulate(rows: list[Row], found: list[Variant], stage: int) -> list[dict]:
    """Accuracy of every variant in ``found`` at every budget (over every gap in ``rows``) and
    their mean, tagged with ``stage`` (0: kernel x pooling, then the round's number, then the
    generation stage's) and the gaps scored; ``forced_nll``: the mean negative log-likelihood
    of the generated text over the gap rows, both budgets (None without gaps)."""
    budgeted = [row for row in rows if row.budget_label]
    gaps = sorted({row.gap for row in budgeted})
    table = []
    for variant in found:
        mine = {label: _rows_of(budgeted, variant.rule, label) for label in BUDGETS}
        scores = {label: sum(row.correct for row in r) / len(r) for label, r in mine.items()}
        nll = [row.forced_nll for r in mine.values() for row in r if row.gap]
        table.append({"stage": stage, "axis": variant.axis, "gaps": gaps,
                      **asdict(variant.rule), **scores,
                      "mean": sum(scores.values()) / len(scores),
                      "correct": sum(row.correct for r in mine.values() for row in r),
                      "forced_nll": sum(nll) / len(nll) if nll else None})
    return table


def choose_kernel(table: list[dict]) -> SplitRule:
    """The best kernel x pooling by mean accuracy over the budgets (ties: the base's)."""
    top = max((e for e in table if e["axis"] == KERNEL_AXIS),
              key=lambda e: (e["mean"], e["kernel"] == BASE.kernel, e["pooling"] == BASE.pooling))
    return replace(BASE, kernel=top["kernel"], pooling=top["pooling"])


def _by_axis(table: list[dict]) -> dict[str, list[dict]]:
    by_axis: dict[str, list[dict]] = defaultdict(list)
    for entry in table:
        by_axis[entry["axis"]].append(entry)
    return by_axis


def choose(table: list[dict], centre: SplitRule) -> SplitRule:
    """Each of ``ROUND_AXES``'s value with the most correct answers in one round's ``table``
    (ties: the centre's)."""
    by_axis = _by_axis(table)
    return replace(centre, **{
        axis: max(by_axis[axis], key=lambda e, a=axis: (e["correct"],
                                                        e[a] == getattr(centre, a)))[axis]
        for axis in ROUND_AXES})


def choose_generation(table: list[dict], centre: SplitRule) -> SplitRule:
    """Each of ``GEN_AXES``'s value, of those within ``GEN_SLACK`` correct answers of the best,
    under which the generated text is best predicted (ties: the centre's)."""
    by_axis = _by_axis(table)
    picks = {}
    for axis in GEN_AXES:
        best = max(e["correct"] for e in by_axis[axis])
        picks[axis] = min((e for e in by_axis[axis] if e["correct"] >= best - GEN_SLACK),
                          key=lambda e, a=axis: (e["forced_nll"],
                                                 e[a] != getattr(centre, a)))[axis]
    return replace(centre, **picks)


def policy_fields(rule: SplitRule) -> dict:
    """The policy file's fields: ``snapstream`` at the serving budget, split by ``rule``."""
    policy = rule.policy("snapstream", SERVING_BUDGET)
    return {"kind": policy.kind, "n_sink": policy.n_sink, "n_topk": policy.n_topk,
            "n_recent": policy.n_recent, "observation": policy.observation, "kernel": policy.kernel,
            "pooling": policy.pooling}


def policy_file_fields(path: Path, swept: dict) -> dict:
    """What ``--write-policy`` writes to the policy file at ``path``: the ``swept`` fields, and
    the fields the sweep does not search (``observe``, ``unit``: chosen on the evaluation grid)
    as the file already has them."""
    given = json.loads(path.read_text()) if path.exists() else {}
    return {key: value for key, value in given.items() if key not in swept} | swept


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    engine = Engine.from_pretrained(args.model)
    cfg = EvalConfig(tasks=tuple(args.tasks.split(",")), context_lens=parse_ints(args.context_lens),
                     placements=tuple(args.placements.split(",")),
                     policies=("full", "snapstream"),
                     n_per_cell=args.n_per_cell, seed=args.seed,
                     prompt_format=args.prompt_format or model_format(engine.tokenizer),
                     max_group_tokens=args.max_group_tokens)
    samples = cfg.samples(engine.tokenizer)
    forwards: dict = {}  # shared by both stages
    first = kernel_variants()
    rows = evaluate(engine, cfg, samples, runs_for=lambda n: sweep_runs(first, n),
                    forwards=forwards, max_observation=max(AXES["observation"]))
    table = tabulate(rows, first, stage=0)
    centres = [choose_kernel(table)]
    for stage in range(1, MAX_ROUNDS + 1):
        centre = centres[-1]
        print(f"round {stage}: kernel, observation, sinks and ring share around {centre}",
              flush=True)
        found = axis_variants(centre)
        done = frozenset(_policy_of(row) for row in rows)
        rows += evaluate(engine, cfg, samples, forwards=forwards,
                         runs_for=lambda n, f=found, d=done: sweep_runs(f, n, with_full=False,
                                                                         skip=d))
        last = tabulate(rows, found, stage)
        table += last
        centres.append(choose(last, centre))
        if centres[-1] == centre:
            break
    descent = centres[-1]
    gen_cfg = replace(cfg, context_lens=(args.gen_context_len,), placements=("after",),
                      gaps=parse_ints(args.gen_gaps), n_per_cell=args.gen_n_per_cell)
    print(f"generation stage: sinks and ring share around {descent}, answers after "
          f"{', '.join(map(str, gen_cfg.gaps))} generated tokens", flush=True)
    found = generation_variants(descent)
    gen_rows = evaluate(engine, gen_cfg, gen_cfg.samples(engine.tokenizer),
                        runs_for=lambda n: sweep_runs(found, n))
    table += tabulate(gen_rows, found, stage=len(centres))
    chosen = choose_generation(table[-len(found):], descent)
    write_outputs(rows + gen_rows, cfg.to_json(), str(args.model or engine.name), args.out)
    result = {"base": asdict(BASE), "centres": [asdict(c) for c in centres[:-1]],
              "descent": asdict(descent), "chosen": asdict(chosen),
              "policy": policy_fields(chosen), "full_accuracy": _full(rows)["accuracy"],
              "generation": {"context_len": args.gen_context_len, "gaps": list(gen_cfg.gaps),
                             "n_per_cell": args.gen_n_per_cell,
                             # the generated text's NLL: the rows with a gap
                             "full": {"accuracy": _full(gen_rows)["accuracy"],
                                      "forced_nll": _full([r for r in gen_rows if r.gap])[
                                          "forced_nll"]}},
              "table": table}
    (args.out / "sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    plot_sweep(table, centres[-2], chosen, result["full_accuracy"],
               result["generation"]["full"], args.out / "sweep.png")
    print(json.dumps(result["policy"]))
    if args.write_policy:
        path = open_checkpoint(args.model).policy_file
        path.write_text(json.dumps(policy_file_fields(path, result["policy"]), indent=1) + "\n")
        print(f"wrote the model's default policy to {path}")
    return 0


def _full(rows: list[Row]) -> dict:
    """The full cache's :func:`~evaluation.results.accuracy_table` entry over
    ``rows``."""
    return next(e for e in accuracy_table(rows, ()) if e["policy"] == "full")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m evaluation.sweep",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help=MODEL_HELP)
    parser.add_argument("--tasks", default="niah,multikey,kv,vartrack,realtext")
    parser.add_argument("--context-lens", default="2048", help="comma-separated token counts")
    parser.add_argument("--placements", default="after",
                        help="where the question goes: after, before or both (after,before)")
    parser.add_argument("--n-per-cell", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--prompt-format", choices=tuple(PROMPT_FORMATS), default=None,
                        help="(default: chat where the model has a chat template, raw for a "
                        "base model)")
    parser.add_argument("--max-group-tokens", type=int, default=16384,
                        help="prompt tokens decoded together (and held at once per group)")
    parser.add_argument("--gen-gaps", default=",".join(map(str, GEN_GAPS)),
                        help="generated tokens before the answer in the generation stage")
    parser.add_argument("--gen-context-len", type=int, default=GEN_CONTEXT_LEN,
                        help="prompt tokens in the generation stage")
    parser.add_argument("--gen-n-per-cell", type=int, default=4,
                        help="prompts per task in the generation stage")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--write-policy", action="store_true",
                        help="write the chosen policy as the model's policy file")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
