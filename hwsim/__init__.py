"""SN40L simulation back end: hardware model, model cost, memory planner, simulated clock.

The stable API a decode worker uses (pure Python, no torch)::

    from hwsim import PolicyConfig, SimClock, SimTarget

    target = SimTarget.load("llama-3.1-8b", sockets=8, policy=PolicyConfig(n_sink=4,
                            n_topk=764, n_recent=256))
    clock = SimClock()
    clock.advance(target.decode_step(batch=num_rows, context_len=longest_context))

See docs/hwsim.md for the model, its sources and its validation.
"""

from hwsim.clock import SimClock
from hwsim.memory import DoesNotFitError
from hwsim.policy import PolicyConfig, PolicyKind
from hwsim.sim import PrefillCost, SimTarget, StepCost

__all__ = [
    "DoesNotFitError",
    "PolicyConfig",
    "PolicyKind",
    "PrefillCost",
    "SimClock",
    "SimTarget",
    "StepCost",
]
