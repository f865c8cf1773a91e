"""PNG figures: accuracy vs budget per placement, and depth x length heat maps per policy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from snapstream.evaluate.results import Row, accuracy_table


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy_vs_budget(overall: list[dict], placements: Sequence[str], path: Path) -> None:
    """One panel per placement: x = budget as a fraction of the context, y = accuracy (all
    tasks), a line per policy, ``full`` as a horizontal line."""
    fig, axes = _pyplot().subplots(1, len(placements), figsize=(5.5 * len(placements), 4),
                                   squeeze=False, sharey=True, layout="constrained")
    for ax, placement in zip(axes[0], placements, strict=True):
        entries = [e for e in overall if e["placement"] == placement]
        for entry in (e for e in entries if e["budget_fraction"] is None):
            ax.axhline(entry["accuracy"], color="black", linestyle="--", label=entry["policy"])
        budgeted = [e for e in entries if e["budget_fraction"] is not None]
        for policy in dict.fromkeys(e["policy"] for e in budgeted):
            points = sorted((e["budget_fraction"], e["accuracy"]) for e in budgeted
                            if e["policy"] == policy)
            ax.plot(*zip(*points, strict=True), marker="o", label=policy)
        ticks = {e["budget_fraction"]: _tick_label(e["budget_label"]) for e in budgeted}
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(ticks), list(ticks.values()))
        ax.minorticks_off()
        ax.set(xlabel="budget / context length", ylabel="exact-match accuracy",
               title=f"question {placement} the context", ylim=(-0.02, 1.02))
        ax.grid(True, alpha=0.3)
        ax.legend()
    _save(fig, path)


def _tick_label(budget_label: str) -> str:
    """Token-count budgets sit at their mean fraction of the context and say so."""
    return f"{budget_label} tok" if budget_label.isdigit() else budget_label


def plot_heatmaps(rows: Sequence[Row], placements: Sequence[str], out_dir: Path) -> None:
    """``heatmap_<policy>.png`` per policy: a panel per (placement, budget) with accuracy (all
    tasks) over depth (rows) x context length (columns)."""
    table = accuracy_table(rows, ("placement", "depth", "context_len"))
    depths = sorted({row.depth for row in rows})
    lengths = sorted({row.context_len for row in rows})
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
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
