"""A simulated clock: advances by the modelled time of each step, next to the wall clock.

Owned by the one thread that runs the decode steps; readers on other threads see plain
floats and ints (each read is atomic in CPython, a pair of reads may straddle a step).
"""

from __future__ import annotations

from hwsim.sim import StepCost


class SimClock:
    def __init__(self) -> None:
        self.elapsed_s = 0.0
        self.steps = 0
        self.tokens = 0

    def advance(self, cost: StepCost, tokens: int | None = None) -> float:
        """Add one step of ``cost``; ``tokens`` emitted defaults to the step's batch (pass the
        number of occupied rows when some are idle). Returns the step's simulated seconds."""
        emitted = cost.batch if tokens is None else tokens
        if not 0 <= emitted <= cost.batch:
            raise ValueError(f"tokens must be in [0, {cost.batch}], got {emitted}")
        self.elapsed_s += cost.step_time_s
        self.steps += 1
        self.tokens += emitted
        return cost.step_time_s

    @property
    def tokens_per_s(self) -> float:
        """Simulated aggregate throughput so far (0 before the first step)."""
        return self.tokens / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def mean_step_s(self) -> float:
        """Simulated inter-token latency of one sequence, averaged over the steps so far."""
        return self.elapsed_s / self.steps if self.steps else 0.0
