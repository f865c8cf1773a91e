"""PNG plots of a sweep: tokens/s vs context, and memory per tier vs context (per socket)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

from hwsim.hardware import GIB, MIB, Tier
from hwsim.policy import PolicyKind
from hwsim.report import Report

_STYLE = {
    PolicyKind.FULL.value: ("-o", "tab:blue"),
    PolicyKind.SNAPSTREAM.value: ("--s", "tab:orange"),
}
_UNIT = {Tier.SRAM: (MIB, "MiB"), Tier.HBM: (GIB, "GiB"), Tier.DDR: (GIB, "GiB")}


def _title(rows: list[Report]) -> str:
    r = rows[0]
    budget = next((row["budget"] for row in rows if row["budget"]), None)
    return (
        f"{r['model']} on {r['sockets']} x {r['hardware']}, batch {r['batch']}, {r['dtype']}"
        f" weights, kv sharding {r['kv_sharding']}, snapstream budget {budget}"
    )


def _by_policy(rows: list[Report]) -> dict[str, list[Report]]:
    groups: dict[str, list[Report]] = {}
    for row in rows:
        groups.setdefault(row["policy"], []).append(row)
    return groups


def _throughput(rows: list[Report], path: Path) -> None:
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    for policy, group in _by_policy(rows).items():
        style, color = _STYLE[policy]
        fits = [r for r in group if r["fits"]]
        ax.plot([r["context"] for r in fits], [r["tokens_per_s"] for r in fits], style,
                color=color, label=f"{policy} (aggregate)")
        if misses := [r["context"] for r in group if not r["fits"]]:
            ax.plot(misses, [0] * len(misses), "x", color=color, markersize=9,
                    label=f"{policy}: does not fit")
    ax.set(xscale="log", xlabel="context (tokens)", ylabel="decode tokens/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.suptitle(_title(rows), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _tier_panel(ax: Axes, rows: list[Report], tier: Tier) -> None:
    scale, unit = _UNIT[tier]
    for policy, group in _by_policy(rows).items():
        style, color = _STYLE[policy]
        ax.plot([r["context"] for r in group], [r["memory"][tier.value] / scale for r in group],
                style, color=color, label=policy)
    capacity = rows[0]["memory_capacity"][tier.value] / scale
    if tier is Tier.HBM:
        ax.axhline(capacity, color="black", linewidth=0.8, label="capacity")
    ax.set(xscale="log", xlabel="context (tokens)", ylabel=f"{unit} per socket",
           title=f"{tier.value.upper()} (capacity {capacity:,.0f} {unit})")
    ax.title.set_fontsize(9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _memory(rows: list[Report], path: Path) -> None:
    fig = Figure(figsize=(12, 4))
    for ax, tier in zip(fig.subplots(1, 3), Tier, strict=True):
        _tier_panel(ax, rows, tier)
    fig.suptitle(_title(rows), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_plots(rows: list[Report], out_dir: Path) -> list[Path]:
    """Write <stem>_tokens_per_s.png and <stem>_memory.png into ``out_dir``, where the stem
    names the model, sockets, batch and KV sharding (hwsim_deepseek-r1_s16_b8_heads)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    r = rows[0]
    stem = f"hwsim_{r['model']}_s{r['sockets']}_b{r['batch']}_{r['kv_sharding']}"
    paths = [out_dir / f"{stem}_tokens_per_s.png", out_dir / f"{stem}_memory.png"]
    _throughput(rows, paths[0])
    _memory(rows, paths[1])
    return paths
