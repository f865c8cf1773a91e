"""Per-run rows, their CSV, accuracy tables grouped by any keys (each accuracy with its 95%
Wilson interval), the rows a compressed run lost against the full cache, and summary.json."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from bench.report import markdown_table

RUN_KEYS = ("policy", "budget_label")
GROUPINGS: dict[str, tuple[str, ...]] = {
    "overall": ("placement", "gap"),
    "by_task": ("task", "placement", "gap"),
    "by_task_length": ("task", "context_len", "placement", "gap"),
}


def markdown_row(cells: Sequence[object]) -> str:
    """One row of a markdown table, printed as a long run goes (each cell already formatted)."""
    return "| " + " | ".join(map(str, cells)) + " |"


def markdown_header(headers: Sequence[str]) -> str:
    return markdown_row(headers) + "\n" + markdown_row(["---"] * len(headers))


@dataclass(frozen=True)
class Row:
    """One sample decoded at one gap under one run. ``budget_label``, ``budget`` and
    ``budget_fraction`` are None for ``full``; ``generated`` is the text up to the point where
    its verdict was decided (``finish_reason`` "verdict"), a stop token or the token limit;
    ``forced_nll`` the mean negative log-likelihood (nats per token) of the tokens decoded as
    given before it (the gap's prose, then the answer cue). A speculative run's row (policy
    ``speculative``) has the target tokens kept as ``budget`` and their share of the prompt
    as ``budget_fraction``."""

    sample: int
    task: str
    context_len: int
    depth: float
    placement: str
    gap: int
    policy: str
    budget_label: str | None
    budget: int | None
    budget_fraction: float | None
    n_sink: int
    n_topk: int
    n_recent: int
    observation: int
    kernel: int
    pooling: str
    correct: bool
    answer: str
    generated: str
    prompt_tokens: int
    new_tokens: int
    finish_reason: str
    forced_nll: float | None
    draft: str | None = None  # speculative rows: the draft model (the target is the run's)
    keep: float | None = None  # speculative rows: the keep share asked for
    # share of the target needles' tokens kept (evaluation.needles; speculative rows: the
    # target tokens the draft kept: 1, the needle whole, so a wrong answer is the target's)
    needle_kept: float | None = None
    # cache policy rows (evaluation.needles): share of the answers' tokens inside the target
    # needles the cache holds, and share of the observation window's votes on the needles
    answer_kept: float | None = None
    needle_attention: float | None = None
    observe: str = "last"  # whose queries SnapKV's window held (CachePolicy.observe)
    unit: str = "token"  # what SnapKV kept whole (CachePolicy.unit)


COLUMNS = tuple(f.name for f in fields(Row))
Z95 = 1.959964  # the standard normal's 97.5% quantile
ANALYSIS = ("needle_kept", "answer_kept", "needle_attention")


def wilson_interval(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of the share ``correct / n`` (95% at the default ``z``); it
    stays inside [0, 1] and is not empty at 0 or ``n`` correct, unlike the normal one."""
    share, spread = correct / n, z * z / n
    centre = (share + spread / 2) / (1 + spread)
    half = z * math.sqrt(share * (1 - share) / n + spread / (4 * n)) / (1 + spread)
    low = 0.0 if correct == 0 else max(0.0, centre - half)
    return low, 1.0 if correct == n else min(1.0, centre + half)


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(COLUMNS)
        writer.writerows(["" if v is None else v for v in astuple(row)] for row in rows)


def accuracy_table(rows: Sequence[Row], keys: Sequence[str]) -> list[dict]:
    """Accuracy per ``keys + (policy, budget_label)`` group, in order of first appearance, with
    ``full_accuracy`` of the same ``keys`` group and ``relative_to_full`` (None where unknown),
    and the group's mean ``forced_nll`` (None where no row decoded forced tokens)."""
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for row in rows:
        groups[tuple(getattr(row, k) for k in (*keys, *RUN_KEYS))].append(row)
    entries = [_entry(dict(zip((*keys, *RUN_KEYS), key, strict=True)), members)
               for key, members in groups.items()]
    full = {tuple(e[k] for k in keys): e["accuracy"] for e in entries if e["policy"] == "full"}
    for entry in entries:
        reference = full.get(tuple(entry[k] for k in keys))
        entry["full_accuracy"] = reference
        entry["relative_to_full"] = entry["accuracy"] / reference if reference else None
    return entries


def _entry(entry: dict, members: list[Row]) -> dict:
    fractions = [row.budget_fraction for row in members if row.budget_fraction is not None]
    correct = sum(row.correct for row in members)
    nll = [row.forced_nll for row in members if row.forced_nll is not None]
    wrong = [row.needle_kept for row in members
             if not row.correct and row.needle_kept is not None]
    low, high = wilson_interval(correct, len(members))
    return entry | {
        "budget_fraction": sum(fractions) / len(fractions) if fractions else None,
        "n": len(members), "correct": correct, "accuracy": correct / len(members),
        "ci_low": low, "ci_high": high,
        "forced_nll": sum(nll) / len(nll) if nll else None,
        # speculative rows' wrong answers: the draft lost part of the needle / kept it whole
        "wrong_needle_lost": sum(share < 1 for share in wrong),
        "wrong_needle_whole": sum(share == 1 for share in wrong),
    }


def losses(rows: Sequence[Row]) -> list[Row]:
    """The rows a run other than ``full`` got wrong on a sample (and gap) that the full cache
    answered right."""
    full_right = {(row.sample, row.gap) for row in rows if row.policy == "full" and row.correct}
    return [row for row in rows
            if row.policy != "full" and not row.correct and (row.sample, row.gap) in full_right]


def analysis_table(rows: Sequence[Row]) -> list[dict]:
    """Per run: the mean of each :data:`ANALYSIS` column over its right rows and over the rows
    it lost against the full cache (None where no row has it)."""
    lost = {id(row) for row in losses(rows)}
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for row in rows:
        groups[tuple(getattr(row, k) for k in RUN_KEYS)].append(row)
    table = []
    for key, members in groups.items():
        entry = dict(zip(RUN_KEYS, key, strict=True))
        for name, chosen in (("right", [r for r in members if r.correct]),
                             ("lost", [r for r in members if id(r) in lost])):
            entry[f"n_{name}"] = len(chosen)
            for column in ANALYSIS:
                values = [getattr(r, column) for r in chosen if getattr(r, column) is not None]
                entry[f"{column}_{name}"] = sum(values) / len(values) if values else None
        table.append(entry)
    return table


def summarize(rows: Sequence[Row], *, config: dict, model: str) -> dict:
    """summary.json: the config, accuracy tables for every grouping in ``GROUPINGS`` and the
    failure analysis per run (:func:`analysis_table`)."""
    tables = {name: accuracy_table(rows, keys) for name, keys in GROUPINGS.items()}
    return {"model": model, "config": config, "num_rows": len(rows), **tables,
            "analysis": analysis_table(rows)}


def summary_table(summary: dict) -> str:
    """Markdown: a row per (policy, budget), a column per task and ``all``; each cell lists the
    accuracy per condition (placement, and the gap where there are several), e.g.
    ``0.95/0.40`` for after/before."""
    conditions = list(dict.fromkeys((e["placement"], e["gap"]) for e in summary["overall"]))
    by_task = {(e["task"], e["placement"], e["gap"], e["policy"], e["budget_label"]):
               e["accuracy"] for e in summary["by_task"]}
    overall = {(e["placement"], e["gap"], e["policy"], e["budget_label"]): e["accuracy"]
               for e in summary["overall"]}
    runs = list(dict.fromkeys((e["policy"], e["budget_label"]) for e in summary["overall"]))
    tasks = summary["config"]["tasks"]
    body = []
    for policy, label in runs:
        cells = [_cell([by_task.get((t, *c, policy, label)) for c in conditions]) for t in tasks]
        body.append([policy, label or "-", *cells,
                     _cell([overall.get((*c, policy, label)) for c in conditions])])
    header = ["policy", "budget", *tasks, "all"]
    names = "/".join(_condition(p, g, len({g for _, g in conditions}) > 1) for p, g in conditions)
    return f"accuracy ({names})\n" + markdown_table(header, body)


def _condition(placement: str, gap: int, show_gap: bool) -> str:
    return f"{placement} gap {gap}" if show_gap else placement


def _cell(values: list[float | None]) -> str:
    return "/".join("-" if v is None else f"{v:.2f}" for v in values)


def cell_table(summary: dict) -> str:
    """Markdown: a row per cell (task, length, placement, and the gap where there are several),
    a column per run; each entry the accuracy, its 95% interval and the samples."""
    from bench.report import markdown_table

    entries = summary["by_task_length"]
    runs = list(dict.fromkeys((e["policy"], e["budget_label"]) for e in entries))
    show_gap = len({e["gap"] for e in entries}) > 1
    cells: dict[tuple, dict[tuple, dict]] = defaultdict(dict)
    for e in entries:
        cell = (e["task"], e["context_len"], e["placement"], *((e["gap"],) if show_gap else ()))
        cells[cell][(e["policy"], e["budget_label"])] = e
    body = [[*cell, *(_interval(by_run.get(run)) for run in runs)]
            for cell, by_run in cells.items()]
    header = ["task", "length", "question", *(["gap"] if show_gap else []),
              *(policy if label is None else f"{policy} {label}" for policy, label in runs)]
    return "accuracy [95% interval] (samples)\n" + markdown_table(header, body)


def _interval(entry: dict | None) -> str:
    if entry is None:
        return "-"
    return f"{entry['accuracy']:.2f} [{entry['ci_low']:.2f}, {entry['ci_high']:.2f}] ({entry['n']})"


def analysis_markdown(summary: dict) -> str:
    """Markdown of summary.json's ``analysis``: per run, the rows lost against the full cache
    and the mean share of the answer kept and of the window's votes on the needle, over the
    run's right rows / its lost rows."""
    from bench.report import markdown_table

    def pair(entry: dict, column: str) -> str:
        return "/".join("-" if entry[f"{column}_{kind}"] is None
                        else f"{entry[f'{column}_{kind}']:.2f}" for kind in ("right", "lost"))

    body = [[e["policy"], e["budget_label"] or "-", e["n_lost"], pair(e, "answer_kept"),
             pair(e, "needle_kept"), pair(e, "needle_attention")]
            for e in summary["analysis"] if e["policy"] != "full"]
    return ("why answers were lost (right rows / rows lost against full; losses.csv lists "
            "them)\n" + markdown_table(["policy", "budget", "lost", "answer kept",
                                         "needle kept", "window votes on needle"], body))
