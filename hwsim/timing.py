"""Step time of one socket (all sockets run in lock step under tensor parallelism).

    step = max(memory, compute) + kernel-call synchronization + tensor-parallel collectives

- memory: bytes read per tier over that tier's achievable bandwidth; tiers stream
  concurrently, so the slowest tier sets the pace;
- compute: FLOPs over achievable FLOP/s; a dataflow pipeline overlaps it with memory;
- synchronization: one kernel call per decoder layer plus one for the head, or, with kernel
  looping (arXiv 2410.23668), one looped call per group of identical layers plus the head;
- collectives: two all-reduces of the activations per layer and one for the head, each a
  fixed latency plus a ring all-reduce's 2(N-1)/N of the bytes over the P2P bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hwsim.hardware import SystemSpec, Tier
from hwsim.model_spec import ModelSpec


@dataclass(frozen=True)
class TimeBreakdown:
    tier_s: Mapping[Tier, float]
    memory_s: float
    compute_s: float
    sync_s: float
    collective_s: float

    @property
    def total_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.sync_s + self.collective_s


def kernel_calls(model: ModelSpec, kernel_looping: bool) -> int:
    decoder_calls = len(model.layer_groups) if kernel_looping else model.n_layers
    return decoder_calls + 1


def collective_s(model: ModelSpec, system: SystemSpec, tokens: int, activation_bytes: int) -> float:
    if system.sockets == 1:
        return 0.0
    n = system.sockets
    payload = tokens * model.hidden_size * activation_bytes
    transfer = 2 * (n - 1) / n * payload / system.socket.p2p_bandwidth
    one = system.socket.collective_latency_s + transfer
    return (2 * model.n_layers + 1) * one


def step_time(
    *,
    tier_reads: Mapping[Tier, float],
    flops: float,
    tokens: int,
    model: ModelSpec,
    system: SystemSpec,
    kernel_looping: bool,
    activation_bytes: int,
) -> TimeBreakdown:
    """Time of one step given one socket's bytes read per off-chip tier and its FLOPs."""
    socket = system.socket
    tier_s = {tier: read / socket.bandwidth(tier) for tier, read in tier_reads.items()}
    return TimeBreakdown(
        tier_s=tier_s,
        memory_s=max(tier_s.values(), default=0.0),
        compute_s=flops / (socket.peak_flops * socket.compute_efficiency),
        sync_s=kernel_calls(model, kernel_looping) * socket.kernel_call_s,
        collective_s=collective_s(model, system, tokens, activation_bytes),
    )
