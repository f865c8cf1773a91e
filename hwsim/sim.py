"""The simulation API: a target (model on a system of sockets) and the cost of its steps.

This is what a decode worker calls each step (see also clock.SimClock)::

    target = SimTarget.load("deepseek-v3", sockets=16, dtype="fp8")
    cost = target.decode_step(batch=len(rows), context_len=longest_context)
    clock.advance(cost)

Byte and FLOP figures named ``*_bytes``/``flops_per_step`` are whole-model counts (one copy
of every tensor, as papers report them); ``socket_*`` and ``memory`` are per socket, where
replicated KV heads count once per socket that holds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from hwsim.config_loader import load_model_spec
from hwsim.dtypes import parse_dtype
from hwsim.hardware import KvSharding, SocketSpec, SystemSpec, Tier, get_hardware
from hwsim.memory import DoesNotFitError, MemoryPlan, plan_memory
from hwsim.model_spec import ModelSpec
from hwsim.policy import PolicyConfig
from hwsim.sharding import per_socket
from hwsim.timing import KernelReads, TimeBreakdown, step_time
from hwsim.work import (
    Kernel,
    Precision,
    Work,
    activation_bytes_per_socket,
    decode_work,
    prefill_work,
)


@dataclass(frozen=True)
class StepCost:
    """One decode step of ``batch`` sequences, each producing one token."""

    batch: int
    cache_tokens: int
    work: Work  # whole model
    socket_work: Work  # one socket
    plan: MemoryPlan  # one socket
    time: TimeBreakdown

    @property
    def step_time_s(self) -> float:
        return self.time.total_s

    @property
    def tokens_per_s_per_user(self) -> float:
        return 1.0 / self.step_time_s

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.step_time_s


@dataclass(frozen=True)
class PrefillCost:
    """Prefill of ``batch`` prompts (weights and KV in HBM; a separate prefill pool)."""

    batch: int
    prompt_len: int
    work: Work
    time: TimeBreakdown

    @property
    def time_s(self) -> float:
        return self.time.total_s


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _socket(hardware: str, overrides: Mapping[str, float]) -> SocketSpec:
    socket = get_hardware(hardware)
    known = {f.name for f in fields(socket)} - {"name"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"hardware_overrides: unknown field(s) {', '.join(unknown)}")
    return replace(socket, **overrides)


@dataclass(frozen=True)
class SimTarget:
    """A model served on ``system`` with a cache ``policy``; all inputs validated up front."""

    model: ModelSpec
    system: SystemSpec
    precision: Precision = field(default_factory=Precision)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    kernel_looping: bool = True
    ddr_spill: bool = False

    @classmethod
    def load(
        cls,
        model: str | ModelSpec,
        *,
        sockets: int = 16,
        hardware: str = "sn40l",
        dtype: str = "bf16",
        kv_dtype: str | None = None,
        policy: PolicyConfig | None = None,
        kv_sharding: str = "heads",
        kernel_looping: bool = True,
        ddr_spill: bool = False,
        hardware_overrides: Mapping[str, float] | None = None,
    ) -> SimTarget:
        """``model`` is a ModelSpec, a shipped target name, a config.json path or a checkpoint
        directory;
        ``hardware_overrides`` replaces SocketSpec fields (e.g. ``hbm_bandwidth``)."""
        weights = parse_dtype(dtype, field="dtype")
        kv = parse_dtype(kv_dtype, field="kv_dtype") if kv_dtype else weights
        try:
            sharding = KvSharding(kv_sharding)
        except ValueError:
            raise ValueError(
                f"kv_sharding: unknown {kv_sharding!r}; choose heads or sequence"
            ) from None
        return cls(
            model=model if isinstance(model, ModelSpec) else load_model_spec(model),
            system=SystemSpec(_socket(hardware, hardware_overrides or {}), sockets, sharding),
            precision=Precision(weights=weights, kv=kv),
            policy=policy or PolicyConfig(),
            kernel_looping=kernel_looping,
            ddr_spill=ddr_spill,
        )

    def _time(self, socket_work: Work, reads: KernelReads) -> TimeBreakdown:
        return step_time(
            reads=reads,
            flops=socket_work.flops,
            tokens=socket_work.tokens,
            model=self.model,
            system=self.system,
            kernel_looping=self.kernel_looping,
            activation_bytes=self.precision.activation_bytes,
        )

    def plan(self, batch: int, context_len: int) -> tuple[Work, Work, MemoryPlan]:
        """Whole-model work, one socket's work and its memory plan (which may not fit)."""
        _check_count("batch", batch)
        cache_tokens = self.policy.cache_tokens(context_len)
        work = decode_work(self.model, batch, cache_tokens, self.precision)
        socket_work = per_socket(work, self.model, self.system)
        activations = activation_bytes_per_socket(
            self.model, batch, self.system.sockets, self.precision
        )
        plan = plan_memory(socket_work, activations, self.system.socket, ddr_spill=self.ddr_spill)
        return work, socket_work, plan

    def decode_step(self, batch: int, context_len: int) -> StepCost:
        """Cost of one decode step; raises DoesNotFitError (a ValueError) naming the tier and
        the shortfall when the configuration does not fit. With the ``full`` policy pass the
        longest context in the batch: a static graph is sized for it."""
        work, socket_work, plan = self.plan(batch, context_len)
        if plan.shortfall is not None:
            raise DoesNotFitError(plan.shortfall)
        reads = {
            kernel: {tier: plan.read_bytes(tier, kernel) for tier in (Tier.HBM, Tier.DDR)}
            for kernel in Kernel
        }
        new_kv = sum(c.write_bytes for c in socket_work.components)  # one K/V row per sequence
        reads[Kernel.DECODER][Tier.HBM] += new_kv
        time = self._time(socket_work, reads)
        return StepCost(batch, self.policy.cache_tokens(context_len), work, socket_work, plan, time)

    def prefill(self, batch: int, prompt_len: int) -> PrefillCost:
        _check_count("batch", batch)
        _check_count("prompt_len", prompt_len)
        work = prefill_work(self.model, batch, prompt_len, self.precision)
        socket_work = per_socket(work, self.model, self.system)
        time = self._time(socket_work, {Kernel.DECODER: {Tier.HBM: socket_work.bytes_moved}})
        return PrefillCost(batch, prompt_len, work, time)
