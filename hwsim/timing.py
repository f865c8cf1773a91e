"""Step time of one socket (all sockets run in lock step under tensor parallelism).

    step = max(memory, compute) + kernel-call synchronization + tensor-parallel collectives

- memory: per kernel, bytes read per tier over that tier's achievable bandwidth; tiers stream
  concurrently within a kernel, so its slowest tier sets the pace. The routed-expert kernel
  starts only once the router has chosen, so its reads never overlap the decoder kernel's:
  the two kernels' times add;
- compute: FLOPs over achievable FLOP/s; a dataflow pipeline overlaps it with memory;
- synchronization: one kernel call per decoder layer plus one for the head, or, with kernel
  looping (arXiv 2410.23668), one looped call per group of identical layers plus the head. An
  MoE layer calls its decoder kernel and then its expert kernel, so its layers cannot be
  looped: two calls per MoE layer with looping (the selected experts run as one looped call),
  1 + one call per expert touched without;
- collectives: two all-reduces of the activations per layer and one for the head, each a
  fixed latency plus a ring all-reduce's 2(N-1)/N of the bytes over the P2P bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from hwsim.hardware import SocketSpec, SystemSpec, Tier
from hwsim.model_spec import LayerGroup, ModelSpec
from hwsim.work import Kernel

KernelReads = Mapping[Kernel, Mapping[Tier, float]]  # bytes read per kernel and tier, 1 socket


@dataclass(frozen=True)
class TimeBreakdown:
    tier_s: Mapping[Tier, float]  # each tier's reads over its bandwidth, all kernels together
    memory_s: float
    compute_s: float
    sync_s: float
    collective_s: float
    kernel_calls: int

    @property
    def total_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.sync_s + self.collective_s


def _group_calls(group: LayerGroup, tokens: int, kernel_looping: bool) -> int:
    experts = math.ceil(round(group.ffn.touched_experts(tokens), 6))  # 8.0000001 is 8 calls
    if not experts:  # consecutive calls of the same decoder kernel
        return 1 if kernel_looping else group.count
    # decoder and expert kernels alternate; the experts of one layer loop among themselves
    return group.count * (1 + (1 if kernel_looping else experts))


def kernel_calls(model: ModelSpec, kernel_looping: bool, tokens: int = 1) -> int:
    """Kernel calls of one step of ``tokens`` tokens: the layer groups' and the head's."""
    return sum(_group_calls(g, tokens, kernel_looping) for g in model.layer_groups) + 1


def collective_s(model: ModelSpec, system: SystemSpec, tokens: int, activation_bytes: int) -> float:
    if system.sockets == 1:
        return 0.0
    n = system.sockets
    payload = tokens * model.hidden_size * activation_bytes
    transfer = 2 * (n - 1) / n * payload / system.socket.p2p_bandwidth
    one = system.socket.collective_latency_s + transfer
    return (2 * model.n_layers + 1) * one


def _memory_s(reads: KernelReads, socket: SocketSpec) -> tuple[dict[Tier, float], float]:
    """Seconds per tier (all kernels) and the memory time: per kernel, its slowest tier."""
    seconds = {k: {t: b / socket.bandwidth(t) for t, b in tiers.items()} for k, tiers in
               reads.items()}
    tier_s: dict[Tier, float] = {}
    for tiers in seconds.values():
        for tier, s in tiers.items():
            tier_s[tier] = tier_s.get(tier, 0.0) + s
    return tier_s, sum(max(tiers.values(), default=0.0) for tiers in seconds.values())


def step_time(
    *,
    reads: KernelReads,
    flops: float,
    tokens: int,
    model: ModelSpec,
    system: SystemSpec,
    kernel_looping: bool,
    activation_bytes: int,
) -> TimeBreakdown:
    """Time of one step given one socket's bytes read per kernel and tier, and its FLOPs."""
    socket = system.socket
    tier_s, memory_s = _memory_s(reads, socket)
    calls = kernel_calls(model, kernel_looping, tokens)
    return TimeBreakdown(
        tier_s=tier_s,
        memory_s=memory_s,
        compute_s=flops / (socket.peak_flops * socket.compute_efficiency),
        sync_s=calls * socket.kernel_call_s,
        collective_s=collective_s(model, system, tokens, activation_bytes),
        kernel_calls=calls,
    )
