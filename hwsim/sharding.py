"""Tensor-parallel split of a step's Work: what one socket stores, reads and computes.

Weights and FLOPs split evenly over the sockets, except the replicated ones (norms, MLA's
down-projections, the MoE router), which every socket holds, reads and computes whole. The KV
cache splits by the system's KvSharding: by KV head (a head count below the socket count
replicates heads; DeepSeek's MLA latent is a single head, so every socket keeps all of it) or
by token position.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from hwsim.hardware import KvSharding, SystemSpec
from hwsim.model_spec import ModelSpec
from hwsim.work import Component, ComponentKind, Work

KV_SHARE: dict[KvSharding, Callable[[ModelSpec, int], float]] = {
    KvSharding.HEADS: lambda model, sockets: (
        math.ceil(model.attention.kv_heads / sockets) / model.attention.kv_heads
    ),
    KvSharding.SEQUENCE: lambda _model, sockets: 1 / sockets,
}


def socket_share(component: Component, model: ModelSpec, system: SystemSpec) -> float:
    """Fraction of ``component`` that each socket holds and streams."""
    if component.is_replicated:
        return 1.0
    if component.kind is ComponentKind.KV_CACHE:
        return KV_SHARE[system.kv_sharding](model, system.sockets)
    return 1 / system.sockets


def per_socket(work: Work, model: ModelSpec, system: SystemSpec) -> Work:
    """The share of ``work`` one socket does (every socket does the same)."""
    components = tuple(_scaled(c, socket_share(c, model, system)) for c in work.components)
    split_flops = (work.flops - work.replicated_flops) / system.sockets
    return Work(components, split_flops + work.replicated_flops, work.tokens,
                work.replicated_flops)


def _scaled(component: Component, share: float) -> Component:
    return replace(
        component,
        resident_bytes=component.resident_bytes * share,
        read_bytes=component.read_bytes * share,
        write_bytes=component.write_bytes * share,
    )
