"""Decode back ends: who runs the static step, and what time it is said to take.

``torch`` reports wall time; ``sn40l-sim`` runs the same torch step and advances a simulated
clock by hwsim's cost model of the chosen target (see docs/hwsim.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hwsim import PolicyConfig, PolicyKind, SimTarget
from hwsim.config_loader import parse_config
from snapstream.config import ModelConfig
from snapstream.decode import Decoder


@dataclass(frozen=True)
class BackendConfig:
    name: str = "torch"
    sim_target: str | None = None  # hwsim target name or config.json; default: served model
    sim_sockets: int = 1


class TorchBackend:
    def __init__(self, config: BackendConfig, model: ModelConfig) -> None:
        del config, model

    def step(self, decoder: Decoder, tokens: torch.Tensor, positions: torch.Tensor
             ) -> tuple[torch.Tensor, float]:
        """-> logits (B, V) and the simulated seconds of this step (0: none)."""
        return decoder.step(tokens, positions), 0.0


class SN40LSimBackend:
    def __init__(self, config: BackendConfig, model: ModelConfig) -> None:
        target = config.sim_target or parse_config("served model", model.to_hf_dict())
        # the worker knows exactly how many slots a step reads: cost them as a plain cache
        self.target = SimTarget.load(target, sockets=config.sim_sockets,
                                     policy=PolicyConfig(kind=PolicyKind.FULL))
        self._costs: dict[tuple[int, int], float] = {}

    def step(self, decoder: Decoder, tokens: torch.Tensor, positions: torch.Tensor
             ) -> tuple[torch.Tensor, float]:
        # the static graph runs the step's rows and reads every slot of its layout: the global
        # layers their budget, a hybrid model's sliding layers their window (hwsim's model spec
        # caps those at the window; a budget below the window costs the global layers at it)
        context = max(group.layout.budget for group in decoder.cache.layout.groups)
        key = (tokens.shape[0], context)
        if key not in self._costs:
            self._costs[key] = self.target.decode_step(*key).step_time_s
        return decoder.step(tokens, positions), self._costs[key]


BACKENDS: dict[str, Callable[[BackendConfig, ModelConfig], TorchBackend | SN40LSimBackend]] = {
    "torch": TorchBackend,
    "sn40l-sim": SN40LSimBackend,
}


def make_backend(config: BackendConfig, model: ModelConfig) -> TorchBackend | SN40LSimBackend:
    if config.name not in BACKENDS:
        raise ValueError(f"backend {config.name!r} is unknown (use one of {sorted(BACKENDS)})")
    return BACKENDS[config.name](config, model)
