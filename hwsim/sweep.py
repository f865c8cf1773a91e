"""Decode reports over a range of contexts for both cache policies (data for the plots)."""

from __future__ import annotations

from dataclasses import replace

from hwsim.policy import PolicyKind
from hwsim.report import Report, decode_report
from hwsim.sim import SimTarget

DEFAULT_CONTEXTS = tuple(1024 << i for i in range(8))  # 1k .. 128k


def sweep(target: SimTarget, batch: int, contexts: tuple[int, ...]) -> list[Report]:
    """One report per (policy, context); configurations that do not fit have fits=False."""
    return [
        decode_report(replace(target, policy=replace(target.policy, kind=kind)), batch, context)
        for kind in PolicyKind
        for context in contexts
    ]


def format_sweep(rows: list[Report]) -> str:
    header = f"{'policy':<11} {'context':>8} {'step ms':>9} {'tok/s/user':>11} {'tok/s':>10}"
    lines = [header + f" {'hbm GiB/socket':>15}  fits"]
    for r in rows:
        fits = r["fits"]
        step = f"{r['step_time_s'] * 1e3:9.3f}" if fits else f"{'-':>9}"
        user = f"{r['tokens_per_s_per_user']:11.1f}" if fits else f"{'-':>11}"
        total = f"{r['tokens_per_s']:10.1f}" if fits else f"{'-':>10}"
        hbm = r["memory"]["hbm"] / (1 << 30)
        lines.append(
            f"{r['policy']:<11} {r['context']:>8} {step} {user} {total} {hbm:15.2f}  {fits}"
        )
    return "\n".join(lines)
