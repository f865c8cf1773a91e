"""PNG figures: accuracy vs budget per task, accuracy vs gap, depth x length heat maps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from evaluation.config import SPECULATIVE
from evaluation.results import Row, accuracy_table


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy_vs_budget(rows: Sequence[Row], path: Path) -> None:
    """A panel per (task or ``all``, placement), at gap 0: x = budget as a fraction of the
    context (fraction budgets only), y = accuracy, a line per policy, ``full`` dashed."""
    rows = [row for row in rows if row.gap == 0]
    if not rows:
        return
    tasks = [*dict.fromkeys(row.task for row in rows), "all"]
    placements = list(dict.fromkeys(row.placement for row in rows))
    tagged = [*rows, *(_as_all(row) for row in rows)]
    table = accuracy_table(tagged, ("task", "placement"))
    fig, axes = _pyplot().subplots(len(tasks), len(placements), squeeze=False, sharex=True,
                                   sharey=True, layout="constrained",
                                   figsize=(4.2 * len(placements), 2.4 * len(tasks)))
    for i, task in enumerate(tasks):
        for j, placement in enumerate(placements):
            entries = [e for e in table if e["task"] == task and e["placement"] == placement]
            _budget_panel(axes[i][j], entries)
            axes[i][j].set_title(f"{task}, question {placement}", fontsize=9)
    axes[0][0].legend(fontsize=7)
    _save(fig, path)


def _as_all(row: Row) -> Row:
    return replace(row, task="all")


def _budget_panel(ax, entries: list[dict]) -> None:
    for entry in (e for e in entries if e["budget_fraction"] is None):
        ax.axhline(entry["accuracy"], color="black", linestyle="--", label=entry["policy"])
    budgeted = [e for e in entries if e["budget_label"] and not e["budget_label"].isdigit()]
    for policy in dict.fromkeys(e["policy"] for e in budgeted):
        points = sorted((e["budget_fraction"], e["accuracy"]) for e in budgeted
                        if e["policy"] == policy)
        ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=policy)
    # the budgets' own labels; a keep share sits at its measured kept share, beside one of
    # them, so it labels the axis only where no budget does
    ticks = ({e["budget_fraction"]: e["budget_label"] for e in budgeted
              if e["policy"] != SPECULATIVE}
             or {e["budget_fraction"]: e["budget_label"] for e in budgeted})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks), [ticks[fraction] for fraction in sorted(ticks)])
    ax.minorticks_off()
    ax.set(ylim=(-0.03, 1.03))
    ax.grid(True, alpha=0.3)


def plot_accuracy_vs_gap(rows: Sequence[Row], path: Path) -> None:
    """Against the tokens generated before the answer, a line per run: accuracy (all tasks),
    and how well the model predicts the generated text (its mean negative log-likelihood)."""
    gaps = sorted({row.gap for row in rows})
    if len(gaps) < 2:
        return
    table = accuracy_table(rows, ("gap",))
    fig, axes = _pyplot().subplots(1, 2, figsize=(11, 4), layout="constrained")
    for run in dict.fromkeys((e["policy"], e["budget_label"]) for e in table):
        entries = sorted((e for e in table if (e["policy"], e["budget_label"]) == run),
                         key=lambda e: e["gap"])
        label = run[0] if run[1] is None else f"{run[0]} {run[1]}"
        axes[0].plot([e["gap"] for e in entries], [e["accuracy"] for e in entries],
                     marker="o", label=label)
        generated = [e for e in entries if e["gap"]]
        axes[1].plot([e["gap"] for e in generated], [e["forced_nll"] for e in generated],
                     marker="o", label=label)
    axes[0].set(ylabel="accuracy", ylim=(-0.03, 1.03), xlim=(0, max(gaps) * 1.1))
    axes[1].set(ylabel="nats per token of the generated text and cue")
    for ax in axes:
        ax.set_xscale("symlog", linthresh=32)
        ax.set(xlabel="tokens generated between question and answer")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)


def plot_heatmaps(rows: Sequence[Row], out_dir: Path) -> None:
    """``heatmap_<policy>.png`` per policy (gap 0): a panel per (placement, budget) with
    accuracy (all tasks) over depth (rows) x context length (columns)."""
    rows = [row for row in rows if row.gap == 0]
    table = accuracy_table(rows, ("placement", "depth", "context_len"))
    depths = sorted({row.depth for row in rows})
    lengths = sorted({row.context_len for row in rows})
    placements = list(dict.fromkeys(row.placement for row in rows))
    for policy in dict.fromkeys(row.policy for row in rows):
        entries = [e for e in table if e["policy"] == policy]
        labels = list(dict.fromkeys(e["budget_label"] for e in entries))
        panel = (max(2.6, 1.4 + 0.7 * len(lengths)), max(2.2, 1.2 + 0.4 * len(depths)))
        fig, axes = _pyplot().subplots(
            len(placements), len(labels), squeeze=False, layout="constrained",
            figsize=(1.0 + panel[0] * len(labels), 0.4 + panel[1] * len(placements)))
        fig.suptitle(f"{policy}: accuracy by needle depth and context length")
        for i, placement in enumerate(placements):
            for j, label in enumerate(labels):
                cells = {(e["depth"], e["context_len"]): e["accuracy"] for e in entries
                         if e["placement"] == placement and e["budget_label"] == label}
                grid = [[cells.get((d, n), float("nan")) for n in lengths] for d in depths]
                image = _heatmap(axes[i][j], grid, depths, lengths)
                title = f"budget {label}, {placement}" if label else f"question {placement}"
                axes[i][j].set_title(title, fontsize=9)
        fig.colorbar(image, ax=axes, shrink=0.8, label="accuracy")
        _save(fig, out_dir / f"heatmap_{policy}.png")


def _heatmap(ax, grid: list[list[float]], depths: list[float], lengths: list[int]):
    image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=8)
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=8)
    ax.set(xlabel="context length", ylabel="depth")
    for y, line in enumerate(grid):
        for x, value in enumerate(line):
            if value == value:  # not NaN
                ax.text(x, y, f"{value:.2f}", ha="center", va="center", fontsize=7)
    return image


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    _pyplot().close(fig)
