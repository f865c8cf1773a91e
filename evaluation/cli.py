"""`snapstream eval`: retrieval accuracy per cache policy and budget, on RULER-style tasks and
on the workloads on real text (evaldata.workloads: codesearch, paraphrase, multineedle).

Runs cell by cell (task, length, placement), each cell's rows kept under --out/cells/ as it
finishes, so that a rerun into the same --out resumes (evaluation.cells). Writes results.csv,
losses.csv (rows a compressed run lost against the full cache, with what it kept of the
needle), summary.json, report.md (accuracy per run, per cell with its 95% interval, the failure
analysis, the accuracy targets), accuracy_vs_budget.png (per task), accuracy_vs_gap.png (with
several gaps) and heatmap_<policy>.png into --out, and prints the report. Budgets:
fractions of each sample's context length (``1/4``) or token counts (``256``), split into
sinks, SnapKV picks and ring by the rule in :mod:`evaluation.budget`. Lengths are in
tokens of the model's tokenizer. With ``--draft-model``, each sample is also answered by the
target prefilling only the tokens the draft keeps at each ``--keep`` share (policy
``speculative`` in the tables; the grid's ``full`` run is its baseline).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from evaldata import PROMPT_FORMATS, model_format
from evaluation.budget import Budget, SplitRule
from evaluation.cells import run_in_cells
from evaluation.config import EvalConfig, SpeculativeGrid
from evaluation.peer_rows import evaluate_peers
from evaluation.plots import (
    plot_accuracy_vs_budget,
    plot_accuracy_vs_gap,
    plot_heatmaps,
)
from evaluation.results import (
    analysis_markdown,
    cell_table,
    losses,
    summarize,
    summary_table,
    write_csv,
)
from evaluation.runner import evaluate
from evaluation.speculative_runs import evaluate_speculative
from evaluation.targets import check_targets, targets_table
from snapstream.checkpoints.registry import DEFAULT_MODEL, DRAFT_HELP, MODEL_HELP, draft_name
from snapstream.engine import Engine
from snapstream.policy import OBSERVES, POOLINGS, UNITS, CachePolicy
from snapstream.specprefill.settings import POSITION_MODES, SpeculativeSettings
from snapstream.weight_formats import AUTO, DTYPE_CHOICES, DTYPE_HELP, KV_DTYPE_HELP, KV_DTYPES


def _list_of(convert: Callable, what: str) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(convert(part.strip()) for part in text.split(",") if part.strip())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}: {exc}") from None
    return parse


SPECULATIVE_DEFAULTS = SpeculativeGrid(draft="")
SPECULATIVE_FLAGS = {"keep": "keeps", "positions": "positions", "chunk_size": "chunk_size",
                     "look_ahead": "look_ahead"}  # flag -> SpeculativeGrid field


def register(parser: argparse.ArgumentParser) -> None:
    d = EvalConfig()
    add = parser.add_argument
    add("--model", default=None, help=MODEL_HELP)
    add("--dtype", choices=DTYPE_CHOICES, default=AUTO, help=DTYPE_HELP)
    add("--kv-dtype", choices=KV_DTYPES, default=None, help=KV_DTYPE_HELP)
    add("--device", default="cpu")
    add("--tasks", type=_list_of(str, "task names"), default=d.tasks)
    add("--context-lens", type=_list_of(int, "integers"), default=d.context_lens)
    add("--depths", type=_list_of(float, "numbers in [0, 1]"), default=d.depths,
        help="needle depths, cycled through within each (task, length, placement) cell")
    add("--placements", type=_list_of(str, "placements"), default=tuple(map(str, d.placements)),
        help="after: question after the context; before: question-agnostic compression")
    add("--policies", type=_list_of(str, "policy names"), default=d.policies)
    add("--budgets", type=_list_of(Budget.parse, "budgets"), default=d.budgets,
        help="fractions of the context (1/4, 0.25) or token counts (256)")
    add("--n-per-cell", type=int, default=d.n_per_cell)
    add("--seed", type=int, default=d.seed)
    add("--prompt-format", choices=tuple(PROMPT_FORMATS), default=None,
        help="raw completion, or the model's chat template (default: chat where the model "
        "has a chat template, raw for a base model)")
    add("--num-distractors", type=int, default=d.num_distractors)
    add("--num-hops", type=int, default=d.num_hops)
    add("--num-values", type=int, default=d.num_values)
    add("--gaps", type=_list_of(int, "integers"), default=d.gaps,
        help="tokens of prose decoded between the question and the answer cue as if "
        "generated (placements=after only); 0: the cue follows the question")
    add("--n-sink", type=int, default=None, help="(default: the model's policy)")
    add("--observation", type=int, default=None, help="(default: the model's policy)")
    add("--recent-fraction", type=float, default=None,
        help="share of the budget for the recent ring, at least --observation tokens (default: "
        "the model's policy)")
    add("--kernel", type=int, default=None, help="SnapKV pooling kernel (default: the model's)")
    add("--pooling", choices=POOLINGS, default=None, help="(default: the model's)")
    add("--observe", choices=OBSERVES, default=None,
        help="opening: SnapKV's window also holds a probe's queries, the last turn's opening "
        "read again after the prompt (the question placed before the context; default: the "
        "model's)"),
    add("--unit", choices=UNITS, default=None,
        help="word: SnapKV keeps a word's tokens together, each scoring the word's best "
        "(default: the model's)")
    add("--limit", type=int, default=None, help="evaluate only N samples spread over the grid")
    add("--max-group-tokens", type=int, default=d.max_group_tokens,
        help="prompt tokens prefilled and decoded together")
    add("--draft-model", default=None,
        help=f"speculative prefill: this draft picks the tokens the target prefills at each "
        f"--keep share, beside the grid's policies (full: the baseline). {DRAFT_HELP}")
    add("--keep", type=_list_of(float, "shares in (0, 1]"), default=None,
        help=f"keep shares of the target's prompt tokens (default: "
        f"{','.join(f'{k:g}' for k in SPECULATIVE_DEFAULTS.keeps)})")
    add("--positions", choices=POSITION_MODES, default=None,
        help="original: kept tokens at their prompt positions; compact: renumbered "
        "(default: compact for a target with sliding-window layers, original otherwise)")
    add("--chunk-size", type=int, default=None, help="draft tokens per chunk")
    add("--look-ahead", type=int, default=None,
        help="draft tokens decoded after the prompt to score with")
    add("--peers", type=_list_of(str, "peer system names"), default=(),
        help="systems of bench.peers that also answer every sample at every budget, in their "
        "own venvs (kvpress-snapkv, openvino-evict, ...; the model must be a GGUF)")
    add("--peer-threads", type=int, default=2, help="threads of each peer's runner")
    add("--out", type=Path, default=Path("eval_results"), help="output directory")
    add("--no-progress", action="store_true", help="hide the progress bar")


def config_from_args(args: argparse.Namespace, model_policy: CachePolicy,
                     model_prompt_format: str, model_positions: str) -> EvalConfig:
    """``model_policy``: the model's default policy, whose split unset flags keep;
    ``model_prompt_format``: the format used unless --prompt-format names one;
    ``model_positions``: the speculative position mode unless --positions names one."""
    given = {name: getattr(args, name) for name in
             ("n_sink", "observation", "recent_fraction", "kernel", "pooling", "observe",
              "unit")}
    rule = replace(SplitRule.from_policy(model_policy),
                   **{name: value for name, value in given.items() if value is not None})
    return EvalConfig(
        tasks=args.tasks, context_lens=args.context_lens, depths=args.depths,
        placements=args.placements, policies=args.policies, budgets=args.budgets,
        n_per_cell=args.n_per_cell, seed=args.seed,
        prompt_format=args.prompt_format or model_prompt_format,
        num_distractors=args.num_distractors, num_hops=args.num_hops,
        num_values=args.num_values, gaps=args.gaps, split_rule=rule, limit=args.limit,
        max_group_tokens=args.max_group_tokens,
        speculative=speculative_from_args(args, model_positions), peers=args.peers)


def speculative_from_args(args: argparse.Namespace, model_positions: str
                          ) -> SpeculativeGrid | None:
    """None without --draft-model (ValueError when a speculative flag is given anyway); the
    positions are ``model_positions`` unless --positions names them."""
    given = {field: getattr(args, flag) for flag, field in SPECULATIVE_FLAGS.items()
             if getattr(args, flag) is not None}
    if args.draft_model is None:
        if given:
            flags = ", ".join(f"--{flag.replace('_', '-')}" for flag in SPECULATIVE_FLAGS
                              if getattr(args, flag) is not None)
            raise ValueError(f"{flags} need(s) --draft-model")
        return None
    return SpeculativeGrid(draft=draft_name(args.draft_model, args.model),
                           **({"positions": model_positions} | given))


def run(args: argparse.Namespace) -> int:
    engine = Engine.from_pretrained(args.model, dtype=args.dtype, device=args.device,
                                    kv_dtype=args.kv_dtype)
    cfg = config_from_args(args, engine.default_policy, model_format(engine.tokenizer),
                           SpeculativeSettings.defaults_for(engine.config).positions)
    longest = max(cfg.context_lens) + max(cfg.gaps)
    if longest > engine.context_len:
        raise ValueError(f"context_lens: {max(cfg.context_lens)} + gap {max(cfg.gaps)} exceeds "
                         f"the model's context of {engine.context_len} tokens")
    samples = cfg.samples(engine.tokenizer)
    draft = None if cfg.speculative is None else Engine.from_pretrained(
        cfg.speculative.draft, dtype=args.dtype, device=args.device)

    def run_cell(indices: list[int], members: list) -> tuple[list, list[dict]]:
        rows = evaluate(engine, cfg, members, progress=not args.no_progress, indices=indices)
        if cfg.peers:
            rows += evaluate_peers(engine, cfg, args.model or DEFAULT_MODEL, indices, members,
                                   n_threads=args.peer_threads)
        if draft is None:
            return rows, []
        drafted, skipped = evaluate_speculative(engine, draft, cfg, members,
                                                progress=not args.no_progress)
        drafted = [replace(row, sample=indices[row.sample]) for row in drafted]
        return rows + drafted, [skip | {"sample": indices[skip["sample"]]} for skip in skipped]

    model = str(args.model or engine.name)
    config = cfg.to_json()
    rows, skipped = run_in_cells(samples, {"model": model, **config}, args.out, run_cell)
    if cfg.speculative is not None:
        config["speculative_skipped"] = skipped
        if skipped:
            print(f"speculative: {len(skipped)} sample(s) longer than the draft's context "
                  "skipped (no speculative rows; listed in summary.json)")
    write_outputs(rows, config, model, args.out)
    return 0


def write_outputs(rows: list, config: dict, model: str, out: Path) -> None:
    """results.csv, losses.csv, summary.json, report.md and the figures into ``out``; prints
    the report."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "results.csv")
    write_csv(losses(rows), out / "losses.csv")
    summary = summarize(rows, config=config, model=model)
    summary["targets"] = check_targets(summary["by_task_length"])
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_accuracy_vs_budget(rows, out / "accuracy_vs_budget.png")
    plot_accuracy_vs_gap(rows, out / "accuracy_vs_gap.png")
    plot_heatmaps(rows, out)
    report = [summary_table(summary), cell_table(summary), analysis_markdown(summary)]
    if summary["targets"]:
        report.append(targets_table(summary["targets"]))
    (out / "report.md").write_text("\n\n".join(report) + "\n")
    print("\n\n".join(report))
    print(f"wrote {len(rows)} rows, report.md and figures to {out}")
