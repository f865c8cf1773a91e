"""SN40L hardware description: one socket's resources and a tensor-parallel system of sockets.

Every number is documented with its source in docs/hwsim.md; the ones SambaNova has not
published (bandwidths, latencies, efficiencies) are assumptions and can be overridden.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MIB = 1 << 20
GIB = 1 << 30


class Tier(StrEnum):
    """The three memory tiers of an SN40L socket, fastest first."""

    SRAM = "sram"
    HBM = "hbm"
    DDR = "ddr"


class KvSharding(StrEnum):
    """How a tensor-parallel system splits each sequence's KV cache across sockets."""

    HEADS = "heads"  # by KV head; heads are replicated when there are fewer heads than sockets
    SEQUENCE = "sequence"  # by token position; every socket holds 1/N of each sequence


def _require_positive(owner: object, *names: str) -> None:
    for name in names:
        if not getattr(owner, name) > 0:
            raise ValueError(f"{name} must be > 0, got {getattr(owner, name)!r}")


def _require_fraction(owner: object, *names: str) -> None:
    for name in names:
        if not 0 < getattr(owner, name) <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {getattr(owner, name)!r}")


@dataclass(frozen=True)
class SocketSpec:
    """One accelerator socket. Capacities in bytes, bandwidths in bytes/s, times in seconds."""

    name: str
    dies: int
    pcus: int
    pmus: int
    peak_flops: float  # dense BF16 FLOP/s; FP8 weights are assumed upcast to BF16 for compute
    sram_bytes: int
    hbm_bytes: int
    ddr_bytes: int
    hbm_bandwidth: float
    ddr_bandwidth: float
    p2p_bandwidth: float  # socket-to-socket, per socket, one direction
    collective_latency_s: float  # fixed cost of one small all-reduce across the system
    kernel_call_s: float  # synchronization cost of one kernel call (pipeline fill and drain)
    memory_efficiency: float  # achievable fraction of peak HBM and DDR bandwidth
    compute_efficiency: float  # achievable fraction of peak FLOP/s

    def __post_init__(self) -> None:
        _require_positive(
            self, "dies", "pcus", "pmus", "peak_flops", "sram_bytes", "hbm_bytes", "ddr_bytes",
            "hbm_bandwidth", "ddr_bandwidth", "p2p_bandwidth",
        )
        for name in ("collective_latency_s", "kernel_call_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        _require_fraction(self, "memory_efficiency", "compute_efficiency")

    def capacity(self, tier: Tier) -> int:
        return {Tier.SRAM: self.sram_bytes, Tier.HBM: self.hbm_bytes, Tier.DDR: self.ddr_bytes}[
            tier
        ]

    def bandwidth(self, tier: Tier) -> float:
        """Achievable bandwidth of an off-chip tier (SRAM holds only the on-chip working set)."""
        peak = {Tier.HBM: self.hbm_bandwidth, Tier.DDR: self.ddr_bandwidth}[tier]
        return peak * self.memory_efficiency


SN40L = SocketSpec(
    name="SN40L",
    dies=2,
    pcus=1040,
    pmus=1040,
    peak_flops=638e12,
    sram_bytes=520 * MIB,
    hbm_bytes=64 * GIB,
    ddr_bytes=1536 * GIB,
    hbm_bandwidth=2.0e12,  # assumption
    ddr_bandwidth=0.2e12,  # assumption
    p2p_bandwidth=100e9,  # assumption
    collective_latency_s=5e-6,  # assumption
    kernel_call_s=20e-6,  # assumption
    memory_efficiency=0.9,  # assumption, from "over 90% of peak" (arXiv 2410.23668)
    compute_efficiency=0.8,  # assumption
)

HARDWARE: dict[str, SocketSpec] = {"sn40l": SN40L}


def get_hardware(name: str) -> SocketSpec:
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(
            f"hardware: unknown {name!r}; choose one of {', '.join(HARDWARE)}"
        ) from None


@dataclass(frozen=True)
class SystemSpec:
    """``sockets`` identical sockets running one model with tensor parallelism."""

    socket: SocketSpec
    sockets: int
    kv_sharding: KvSharding = KvSharding.HEADS

    def __post_init__(self) -> None:
        if isinstance(self.sockets, bool) or not isinstance(self.sockets, int):
            raise ValueError(f"sockets must be an integer, got {self.sockets!r}")
        if self.sockets < 1:
            raise ValueError(f"sockets must be >= 1, got {self.sockets}")
        if not isinstance(self.kv_sharding, KvSharding):
            raise ValueError(f"kv_sharding must be a KvSharding, got {self.kv_sharding!r}")
