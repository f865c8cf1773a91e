"""Memory planner: places one socket's weights, KV cache and working set across SRAM/HBM/DDR.

- SRAM holds the on-chip working set (activations); it must fit.
- DDR holds the model store, a copy of every weight (the SN40L serves weights from HBM and
  keeps the model in DDR).
- HBM holds what decoding reads: weights and KV caches, most-read-per-byte first. What does
  not fit either spills to DDR (with ``ddr_spill``: spilled weights are read from their store
  copy, spilled KV adds DDR bytes) or makes the plan fail with a Shortfall, the way a static
  graph that needs more memory than the socket has cannot be compiled.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwsim.hardware import GIB, SocketSpec, Tier
from hwsim.work import ComponentKind, Kernel, Work


@dataclass(frozen=True)
class TierPlacement:
    component: str
    tier: Tier
    resident_bytes: float
    read_bytes: float  # per step
    kernel: Kernel = Kernel.DECODER  # the kernel that reads it


@dataclass(frozen=True)
class Shortfall:
    tier: Tier
    needed_bytes: float
    capacity_bytes: float
    hint: str

    @property
    def missing_bytes(self) -> float:
        return self.needed_bytes - self.capacity_bytes

    def message(self) -> str:
        return (
            f"does not fit: {self.tier.value.upper()} short by {self.missing_bytes / GIB:.2f} GiB"
            f" per socket (needs {self.needed_bytes / GIB:.2f} GiB, has"
            f" {self.capacity_bytes / GIB:.2f} GiB); {self.hint}"
        )


class DoesNotFitError(ValueError):
    """A configuration whose static graph would not fit in a memory tier."""

    def __init__(self, shortfall: Shortfall) -> None:
        super().__init__(shortfall.message())
        self.shortfall = shortfall


@dataclass(frozen=True)
class MemoryPlan:
    placements: tuple[TierPlacement, ...]
    shortfall: Shortfall | None

    @property
    def fits(self) -> bool:
        return self.shortfall is None

    def used_bytes(self, tier: Tier) -> float:
        return sum(p.resident_bytes for p in self.placements if p.tier is tier)

    def read_bytes(self, tier: Tier, kernel: Kernel | None = None) -> float:
        """Bytes one step reads from ``tier``; only those ``kernel`` reads, when given."""
        return sum(
            p.read_bytes for p in self.placements
            if p.tier is tier and kernel in (None, p.kernel)
        )


_HINTS = {
    Tier.SRAM: "reduce --batch",
    Tier.HBM: "reduce --batch or --context, use --policy snapstream, add --sockets, "
    "use --dtype fp8 or allow --ddr-spill",
    Tier.DDR: "reduce --batch or --context, or add --sockets",
}


def _overflow(tier: Tier, needed: float, socket: SocketSpec) -> Shortfall | None:
    capacity = socket.capacity(tier)
    return Shortfall(tier, needed, capacity, _HINTS[tier]) if needed > capacity else None


def _serve(work: Work, socket: SocketSpec, ddr_spill: bool) -> tuple[list[TierPlacement], float]:
    """Fill HBM with the most-read components first; returns placements and bytes left over."""
    free = float(socket.hbm_bytes)
    placements: list[TierPlacement] = []
    left_over = 0.0
    for c in sorted(work.components, key=lambda c: c.read_intensity, reverse=True):
        in_hbm = min(c.resident_bytes, free)
        free -= in_hbm
        rest = c.resident_bytes - in_hbm
        if in_hbm:
            placements.append(
                TierPlacement(c.name, Tier.HBM, in_hbm, c.read_intensity * in_hbm, c.kernel)
            )
        if rest and ddr_spill:  # spilled weights are served from the DDR store copy
            store_copy = c.kind is ComponentKind.WEIGHTS
            placements.append(TierPlacement(
                c.name, Tier.DDR, 0.0 if store_copy else rest, c.read_intensity * rest, c.kernel
            ))
        elif rest:
            left_over += rest
    return placements, left_over


def plan_memory(
    work: Work, activation_bytes: float, socket: SocketSpec, *, ddr_spill: bool = False
) -> MemoryPlan:
    """Place one socket's share of ``work`` (see sharding.per_socket) on ``socket``."""
    placements = [TierPlacement("activations", Tier.SRAM, activation_bytes, 0.0)]
    store = work.resident_bytes(ComponentKind.WEIGHTS)
    placements.append(TierPlacement("weights/store", Tier.DDR, store, 0.0))
    served, left_over = _serve(work, socket, ddr_spill)
    placements.extend(served)
    plan = MemoryPlan(tuple(placements), None)
    shortfall = (
        _overflow(Tier.SRAM, activation_bytes, socket)
        or _overflow(Tier.HBM, plan.used_bytes(Tier.HBM) + left_over, socket)
        or _overflow(Tier.DDR, plan.used_bytes(Tier.DDR), socket)
    )
    return MemoryPlan(tuple(placements), shortfall)
