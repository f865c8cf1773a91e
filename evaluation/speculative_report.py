"""The speculative grid across pairs: one table and one figure from several ``snapstream eval
--draft-model`` output directories (one per draft -> target pair); and the kept tokens of
one prompt drawn as strips.

Target: at keep 0.25 the target keeps >= 90% of its full-prompt accuracy on every
task where the full prompt answers >= 50%.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.report import markdown_table
from evaluation.config import FULL, SPECULATIVE
from evaluation.plots import _pyplot, _save

TARGET_KEEP, TARGET_SHARE, TARGET_FULL_AT_LEAST = 0.25, 0.9, 0.5


def load_pair(out_dir: Path) -> dict:
    """An eval directory's summary.json with its pair named (``draft -> target``, and the
    position mode unless ``original``: runs of two modes are two pairs)."""
    summary = json.loads((out_dir / "summary.json").read_text())
    spec = summary["config"]["speculative"]
    if spec is None:
        raise ValueError(f"{out_dir}: not a speculative run (eval without --draft-model)")
    positions = "" if spec["positions"] == "original" else f", {spec['positions']} positions"
    return summary | {"pair": f"{Path(spec['draft']).name} → {Path(summary['model']).name}"
                              f"{positions}", "keeps": spec["keeps"]}


# what tells one accuracy entry of a summary from another (the grouping's keys, the run's)
_ENTRY_KEYS = ("task", "context_len", "placement", "gap", "policy", "budget_label")


def load_pairs(out_dirs: list[Path]) -> list[dict]:
    """:func:`load_pair` of each directory, those of one pair merged (e.g. one run per length):
    their tasks, lengths and keep shares joined, the answers of equal cells added up."""
    pairs: dict[str, list[dict]] = {}
    for out_dir in out_dirs:
        summary = load_pair(out_dir)
        pairs.setdefault(summary["pair"], []).append(summary)
    return [_merged(runs) for runs in pairs.values()]


def _merged(runs: list[dict]) -> dict:
    config = runs[0]["config"] | {
        key: list(dict.fromkeys(v for run in runs for v in run["config"][key]))
        for key in ("tasks", "context_lens")} | {
        "speculative_skipped": [s for run in runs
                                for s in run["config"].get("speculative_skipped", [])]}
    return runs[0] | {
        "config": config, "keeps": sorted({k for run in runs for k in run["keeps"]}),
        **{name: _added([e for run in runs for e in run[name]])
           for name in ("by_task", "by_task_length")}}


# what adds up over runs: answers right, samples, and the wrong answers by whose miss it is
_COUNTS = ("correct", "n", "wrong_needle_lost", "wrong_needle_whole")


def _added(entries: list[dict]) -> list[dict]:
    """Entries of equal keys summed (``_COUNTS``), their accuracy recomputed."""
    cells: dict[tuple, dict] = {}
    for entry in entries:
        key = tuple(entry.get(k) for k in _ENTRY_KEYS)
        if key in cells:
            cells[key] |= {k: cells[key][k] + entry[k] for k in _COUNTS}
        else:
            cells[key] = dict(entry)
    return [cell | {"accuracy": cell["correct"] / cell["n"]} for cell in cells.values()]


def _cells(entries: list[dict], keeps: list[float]) -> tuple[dict | None, list[dict | None]]:
    by_keep = {e["budget_label"]: e for e in entries if e["policy"] == SPECULATIVE}
    full = next((e for e in entries if e["policy"] == FULL), None)
    return full, [by_keep.get(f"keep {k:g}") for k in keeps]


def _at_target(cells: list[dict | None], keeps: list[float]) -> dict | None:
    return cells[keeps.index(TARGET_KEEP)] if TARGET_KEEP in keeps else None


def _fmt(entry: dict | None) -> str:
    return "—" if entry is None else f"{entry['correct']}/{entry['n']}"


def verdict(full: dict | None, at_target: dict | None) -> str:
    """met / missed / n.a. (full below 50%, or no keep-0.25 run)."""
    if full is None or at_target is None or full["accuracy"] < TARGET_FULL_AT_LEAST:
        return "n.a."
    return "met" if at_target["accuracy"] >= TARGET_SHARE * full["accuracy"] else "missed"


def _whose(entry: dict | None) -> str:
    """``draft lost / target failed``: the wrong answers whose needle the draft did not keep
    whole, and those whose needle it kept whole ("" with no wrong answer)."""
    if entry is None or entry["correct"] == entry["n"]:
        return ""
    return f"{entry['wrong_needle_lost']} / {entry['wrong_needle_whole']}"


def _skipped(pair: dict, task: str, length: int | None) -> str:
    """Samples of the cell (``length`` None: every length) the draft could not read."""
    count = sum(s["task"] == task and length in (None, s["context_len"])
                for s in pair["config"]["speculative_skipped"])
    return str(count) if count else ""


def table(pairs: list[dict]) -> str:
    """A row per (pair, task, length) and per (pair, task) over all lengths (bold), answers
    right out of samples (a skipped sample has no keep answers); the target's verdict on the
    task rows."""
    keeps = sorted({k for p in pairs for k in p["keeps"]})
    body = []
    for pair in pairs:
        tasks = pair["config"]["tasks"]
        for task in tasks:
            for length in pair["config"]["context_lens"]:
                entries = [e for e in pair["by_task_length"]
                           if e["task"] == task and e["context_len"] == length]
                full, cells = _cells(entries, keeps)
                body.append([pair["pair"], task, length, _fmt(full), *map(_fmt, cells),
                             _whose(_at_target(cells, keeps)), _skipped(pair, task, length), ""])
            full, cells = _cells([e for e in pair["by_task"] if e["task"] == task], keeps)
            at = _at_target(cells, keeps)
            body.append([pair["pair"], f"**{task}**", "all", f"**{_fmt(full)}**",
                         *(f"**{_fmt(c)}**" for c in cells), _whose(at),
                         _skipped(pair, task, None), verdict(full, at)])
    headers = ["draft → target", "task", "length", "full", *(f"keep {k:.0%}" for k in keeps),
               f"keep {TARGET_KEEP:.0%} wrong: needle lost / kept whole",
               "skipped (too long for the draft)",
               f"keep {TARGET_KEEP:.0%} ≥ {TARGET_SHARE:.0%} of full"]
    return markdown_table(headers, body)


def plot_accuracy_vs_keep(pairs: list[dict], path: Path) -> None:
    """A panel per pair: x = keep share (full at 1), y = accuracy, a line per task."""
    fig, axes = _pyplot().subplots(1, len(pairs), squeeze=False, sharey=True,
                                   layout="constrained", figsize=(4.2 * len(pairs), 3.2))
    for ax, pair in zip(axes[0], pairs, strict=True):
        keeps = pair["keeps"]
        for task, marker in zip(pair["config"]["tasks"], "os^vD", strict=False):
            full, cells = _cells([e for e in pair["by_task"] if e["task"] == task], keeps)
            xs = [k for k, c in zip(keeps, cells, strict=True) if c is not None] + [1.0]
            ys = [c["accuracy"] for c in cells if c is not None] + [full["accuracy"]]
            ax.plot(xs, ys, marker=marker, alpha=0.7, label=task)  # equal lines overlap
        ax.axvline(TARGET_KEEP, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_xticks([*keeps, 1.0], [*(f"{k:.0%}" for k in keeps), "full"])
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("target tokens kept (share of the prompt)")
        ax.set_title(pair["pair"], fontsize=9)
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].legend(fontsize=7)
    _save(fig, path)


def _runs(mask: list[bool]) -> list[tuple[int, int]]:
    """(start, length) of every run of True in ``mask``."""
    runs, start = [], None
    for i, value in enumerate([*mask, False]):
        if value and start is None:
            start = i
        elif not value and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def plot_kept_chunks(kept: dict[float, list[bool]], marks: dict[str, tuple[int, int]],
                     title: str, path: Path) -> None:
    """A strip per keep share over the prompt's target tokens, kept runs filled; ``marks``:
    labelled [start, end) token spans drawn across every strip (the needle, the question)."""
    fig, ax = _pyplot().subplots(layout="constrained", figsize=(10, 0.6 + 0.5 * len(kept)))
    for row, mask in enumerate(kept.values()):
        ax.broken_barh(_runs(mask), (row - 0.35, 0.7), color="tab:blue")
    for (label, (start, end)), color in zip(marks.items(), ("tab:red", "tab:green"),
                                            strict=False):
        ax.axvspan(start, max(end, start + 1), color=color, alpha=0.5, label=label)
    length = len(next(iter(kept.values())))
    ax.set_xlim(0, length)
    ax.set_yticks(range(len(kept)), [f"keep {k:.0%}" for k in kept])
    ax.set_xlabel("target token of the prompt")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, path)
