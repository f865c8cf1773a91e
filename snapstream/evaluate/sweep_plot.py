"""The sweep's figure: accuracy against each swept axis, a line per budget (and pooling)."""

from __future__ import annotations

from pathlib import Path

from snapstream.evaluate.budget import SplitRule
from snapstream.evaluate.plots import _pyplot, _save

PANELS = (("kernel x pooling", "kernel"), ("window", "window"), ("n_sink", "n_sink"),
          ("recent_fraction", "recent_fraction"))


def plot_sweep(table: list[dict], centre: SplitRule, chosen: SplitRule, full_accuracy: float,
               path: Path) -> None:
    """The first stage's kernel x pooling, then the last round's axes; ``centre``: the rule that
    round varies one axis of at a time; ``full_accuracy``: the full cache's on the same
    samples, drawn as the ceiling."""
    budgets = [key for key in table[0] if "/" in key]
    last = max(e["stage"] for e in table)
    fig, axes = _pyplot().subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.6),
                                   sharey=True, layout="constrained")
    for ax, (axis, field) in zip(axes, PANELS, strict=True):
        stage = 0 if axis == "kernel x pooling" else last
        entries = [e for e in table if e["axis"] == axis and e["stage"] == stage]
        poolings = dict.fromkeys(e["pooling"] for e in entries)
        for label in budgets:
            for pooling in poolings:
                points = sorted((e[field], e[label]) for e in entries if e["pooling"] == pooling)
                name = f"{label} {pooling}" if len(poolings) > 1 else label
                ax.plot(*zip(*points, strict=True), marker="o", label=name)
        ax.axhline(full_accuracy, color="grey", linestyle="--", label="full cache")
        ax.axvline(getattr(chosen, field), color="black", linestyle=":", label="chosen")
        if field in ("kernel", "window"):
            ax.set_xscale("log", base=2)
        where = "window, sinks, ring at base" if axis == "kernel x pooling" else "others at centre"
        ax.set(xlabel=field, title=f"{axis} ({where})", ylim=(-0.03, 1.03))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("snapstream accuracy")
    fig.suptitle(f"round {last} around {centre}", fontsize=8)
    _save(fig, path)
