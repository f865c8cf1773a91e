"""Plain-data reports of a simulated decode configuration, for JSON and for the terminal."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hwsim.hardware import GIB, Tier
from hwsim.memory import MemoryPlan
from hwsim.policy import PolicyKind
from hwsim.sim import SimTarget, StepCost
from hwsim.work import ComponentKind

Report = dict[str, Any]


def _target_fields(target: SimTarget) -> Report:
    policy = target.policy
    return {
        "model": target.model.name,
        "params": target.model.params(),
        "hardware": target.system.socket.name,
        "hardware_spec": asdict(target.system.socket),  # the assumptions behind this result
        "sockets": target.system.sockets,
        "policy": policy.kind.value,
        "budget": policy.budget if policy.kind is PolicyKind.SNAPSTREAM else None,
        "dtype": target.precision.weights.value,
        "kv_dtype": target.precision.kv.value,
        "kv_sharding": target.system.kv_sharding.value,
        "kernel_looping": target.kernel_looping,
        "ddr_spill": target.ddr_spill,
    }


def _timing_fields(cost: StepCost | None) -> Report:
    if cost is None:
        keys = ("step_time_s", "tokens_per_s_per_user", "tokens_per_s", "time_breakdown_s",
                "kernel_calls")
        return dict.fromkeys(keys)
    time = cost.time
    breakdown = {tier.value: seconds for tier, seconds in time.tier_s.items()}
    breakdown |= {"memory": time.memory_s, "compute": time.compute_s, "sync": time.sync_s,
                  "collectives": time.collective_s}
    return {
        "step_time_s": cost.step_time_s,
        "tokens_per_s_per_user": cost.tokens_per_s_per_user,
        "tokens_per_s": cost.tokens_per_s,
        "time_breakdown_s": breakdown,
        "kernel_calls": time.kernel_calls,
    }


def _memory_needed(plan: MemoryPlan) -> dict[str, int]:
    """Bytes per socket each tier holds; for the tier that overflows, the bytes it would need."""
    memory = {tier.value: round(plan.used_bytes(tier)) for tier in Tier}
    if plan.shortfall is not None:
        memory[plan.shortfall.tier.value] = round(plan.shortfall.needed_bytes)
    return memory


def decode_report(target: SimTarget, batch: int, context_len: int) -> Report:
    """Everything about one decode configuration; timing fields are None when it does not
    fit, and ``error`` then names the tier and the shortfall."""
    work, socket_work, plan = target.plan(batch, context_len)
    cost = target.decode_step(batch, context_len) if plan.fits else None
    prefill = target.prefill(1, context_len)
    socket = target.system.socket
    return {
        **_target_fields(target),
        "batch": batch,
        "context": context_len,
        "cache_tokens": target.policy.cache_tokens(context_len),
        "weight_bytes": round(work.resident_bytes(ComponentKind.WEIGHTS)),
        "kv_cache_bytes": round(work.resident_bytes(ComponentKind.KV_CACHE)),
        "bytes_per_step": round(work.bytes_moved),
        "flops_per_step": round(work.flops),
        "arithmetic_intensity": work.flops / work.bytes_moved,
        "socket_bytes_per_step": round(socket_work.bytes_moved),
        "socket_flops_per_step": round(socket_work.flops),
        **_timing_fields(cost),
        "memory": _memory_needed(plan),
        "memory_capacity": {tier.value: socket.capacity(tier) for tier in Tier},
        "prefill": {"prompt_len": context_len, "bytes": round(prefill.work.bytes_moved),
                    "flops": round(prefill.work.flops), "time_s": prefill.time_s},
        "fits": plan.fits,
        "error": None if plan.fits else plan.shortfall.message(),
    }


def _gib(value: float) -> str:
    return f"{value / GIB:,.2f} GiB"


def _ms(value: float) -> str:
    return f"{value * 1e3:,.3f} ms"


def _timing_lines(r: Report) -> list[str]:
    if r["step_time_s"] is None:
        return ["step time     - (does not fit)"]
    t = r["time_breakdown_s"]
    return [
        f"step time     {_ms(r['step_time_s'])} = max(memory {_ms(t['memory'])} [hbm"
        f" {_ms(t['hbm'])}, ddr {_ms(t['ddr'])}], compute {_ms(t['compute'])})"
        f" + sync {_ms(t['sync'])} ({r['kernel_calls']} calls) + collectives"
        f" {_ms(t['collectives'])}",
        f"tokens/s      {r['tokens_per_s_per_user']:,.1f} per user,"
        f" {r['tokens_per_s']:,.1f} aggregate",
    ]


def _hardware_line(r: Report) -> str:
    h = r["hardware_spec"]
    return (
        f"socket        {h['name']}: {h['dies']} dies, {h['pcus']} PCUs, {h['pmus']} PMUs,"
        f" {h['peak_flops'] / 1e12:,.0f} TFLOP/s, HBM {h['hbm_bandwidth'] / 1e12:.2f} TB/s,"
        f" DDR {h['ddr_bandwidth'] / 1e12:.2f} TB/s, P2P {h['p2p_bandwidth'] / 1e9:,.0f} GB/s"
    )


def format_text(r: Report) -> str:
    budget = f" (budget {r['budget']})" if r["budget"] else ""
    lines = [
        f"target        {r['model']} ({r['params'] / 1e9:,.2f}B params) on {r['sockets']} x"
        f" {r['hardware']}",
        _hardware_line(r),
        f"config        batch {r['batch']}, context {r['context']}, policy {r['policy']}{budget},"
        f" weights {r['dtype']}, kv {r['kv_dtype']}, kv sharding {r['kv_sharding']},"
        f" kernel looping {'on' if r['kernel_looping'] else 'off'}",
        f"weights       {_gib(r['weight_bytes'])}   kv cache {_gib(r['kv_cache_bytes'])}"
        f" ({r['cache_tokens']} tokens per sequence)",
        f"per step      {_gib(r['bytes_per_step'])} moved, {r['flops_per_step'] / 1e9:,.1f}"
        f" GFLOP, {r['arithmetic_intensity']:.2f} FLOP/byte",
        *_timing_lines(r),
        f"prefill       {_ms(r['prefill']['time_s'])} for one {r['context']}-token prompt",
        "memory/socket " + ", ".join(
            f"{tier} {_gib(used)} / {_gib(r['memory_capacity'][tier])}"
            for tier, used in r["memory"].items()
        ),
    ]
    return "\n".join(lines)
