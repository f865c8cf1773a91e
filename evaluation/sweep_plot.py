"""The sweep's figure: accuracy against each swept axis, a line per budget (and pooling)."""

from __future__ import annotations

from pathlib import Path

from evaluation.budget import SplitRule
from evaluation.plots import _pyplot, _save

# (axis, the rule's field on the x axis, stage): "first" is the kernel x pooling stage, "round"
# the descent's last round, "generation" the sinks and ring scored after generated tokens
PANELS = (("kernel x pooling", "kernel", "first"), ("observation", "observation", "round"),
          ("n_sink", "n_sink", "round"), ("recent_fraction", "recent_fraction", "round"),
          ("n_sink", "n_sink", "generation"),
          ("recent_fraction", "recent_fraction", "generation"))
COLUMNS = 3


def plot_sweep(table: list[dict], centre: SplitRule, chosen: SplitRule, full_accuracy: float,
               generation_full: dict, path: Path) -> None:
    """The first stage's kernel x pooling, the last round's axes, then the generation stage's
    (with the generated text's negative log-likelihood on a second axis, one scale for both
    panels); ``centre``: the rule the last round varies one axis of at a time; the full cache's
    accuracy on each stage's samples (``generation_full``: its ``accuracy`` and ``forced_nll``
    in the generation stage) is drawn as its ceiling."""
    budgets = [key for key in table[0] if "/" in key]
    last = max(e["stage"] for e in table)
    stages = {"first": 0, "round": last - 1, "generation": last}
    ceilings = {"first": full_accuracy, "round": full_accuracy,
                "generation": generation_full["accuracy"]}
    nll = [e["forced_nll"] for e in table if e["stage"] == last]
    nll_limits = _padded(min(*nll, generation_full["forced_nll"]),
                         max(*nll, generation_full["forced_nll"]))
    rows = -(-len(PANELS) // COLUMNS)
    fig, axes = _pyplot().subplots(rows, COLUMNS, figsize=(4.2 * COLUMNS, 3.6 * rows),
                                   sharey=True, layout="constrained")
    for ax, (axis, field, stage) in zip(axes.flat, PANELS, strict=True):
        entries = [e for e in table if e["axis"] == axis and e["stage"] == stages[stage]]
        poolings = dict.fromkeys(e["pooling"] for e in entries)
        for label in budgets:
            for pooling in poolings:
                points = sorted((e[field], e[label]) for e in entries if e["pooling"] == pooling)
                name = f"{label} {pooling}" if len(poolings) > 1 else label
                ax.plot(*zip(*points, strict=True), marker="o", label=name)
        ax.axhline(ceilings[stage], color="grey", linestyle="--", label="full cache")
        if stage == "generation":
            _plot_nll(ax, entries, field, generation_full["forced_nll"], nll_limits)
        ax.axvline(getattr(chosen, field), color="black", linestyle=":", label="chosen")
        if field in ("kernel", "observation"):
            ax.set_xscale("log", base=2)
        gaps = ", ".join(map(str, entries[0]["gaps"]))
        where = {"first": "observation, sinks, ring at base", "round": "others at centre",
                 "generation": f"after {gaps} generated tokens"}[stage]
        ax.set(xlabel=field, title=f"{axis} ({where})", ylim=(-0.03, 1.03))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("snapstream accuracy")
    fig.suptitle(f"round {last - 1} around {centre}; chosen {chosen}", fontsize=8)
    _save(fig, path)


def _plot_nll(ax, entries: list[dict], field: str, full_nll: float,
              limits: tuple[float, float]) -> None:
    """The generated text's mean negative log-likelihood against ``field``, right axis, with
    the full cache's."""
    twin = ax.twinx()
    points = sorted((e[field], e["forced_nll"]) for e in entries)
    twin.plot(*zip(*points, strict=True), color="black", marker="x", linestyle="-.",
              label="NLL of generated text")
    twin.axhline(full_nll, color="grey", linestyle="-.", label="NLL, full cache")
    twin.set(ylabel="nats per generated token", ylim=limits)
    twin.legend(fontsize=7, loc="center right")


def _padded(low: float, high: float) -> tuple[float, float]:
    pad = 0.1 * max(high - low, 1e-3)
    return low - pad, high + pad
