"""Bytes and FLOPs of one model step, from the model's shapes alone (whole model, one copy).

A step's memory traffic is a list of named components (weights of the decoder layers, weights
every socket keeps whole, routed experts, embedding, head, KV cache), each with the bytes it
occupies and the bytes one step reads and writes, and the kernel that streams it. Activations
stay on chip and are not counted as bytes moved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from hwsim.dtypes import DTYPE_BYTES, DType
from hwsim.model_spec import ModelSpec


class ComponentKind(StrEnum):
    WEIGHTS = "weights"
    KV_CACHE = "kv_cache"


class Kernel(StrEnum):
    """Which kernel of a decoder layer streams a component. Routed experts are gathered by
    their own kernel, which can start only once the router has chosen them; its reads cannot
    overlap the decoder kernel's (docs/hwsim.md, section 3)."""

    DECODER = "decoder"
    EXPERTS = "experts"


@dataclass(frozen=True)
class Component:
    name: str
    kind: ComponentKind
    resident_bytes: float
    read_bytes: float
    write_bytes: float = 0.0
    is_replicated: bool = False  # every socket holds and reads all of it under tensor parallel
    kernel: Kernel = Kernel.DECODER

    @property
    def read_intensity(self) -> float:
        """Fraction of the resident bytes one step reads: what earns a place in a fast tier."""
        return self.read_bytes / self.resident_bytes if self.resident_bytes else 0.0


@dataclass(frozen=True)
class Precision:
    weights: DType = DType.BF16
    kv: DType = DType.BF16
    activations: DType = DType.BF16

    @property
    def weight_bytes(self) -> int:
        return DTYPE_BYTES[self.weights]

    @property
    def kv_bytes(self) -> int:
        return DTYPE_BYTES[self.kv]

    @property
    def activation_bytes(self) -> int:
        return DTYPE_BYTES[self.activations]


@dataclass(frozen=True)
class Work:
    """One step: ``tokens`` tokens through the model, ``flops`` of arithmetic, of which
    ``replicated_flops`` are the replicated matrices' (every socket computes them whole)."""

    components: tuple[Component, ...]
    flops: float
    tokens: int
    replicated_flops: float = 0.0

    def resident_bytes(self, kind: ComponentKind) -> float:
        return sum(c.resident_bytes for c in self.components if c.kind is kind)

    @property
    def bytes_moved(self) -> float:
        return sum(c.read_bytes + c.write_bytes for c in self.components)


def _layer_components(model: ModelSpec, tokens: int, wb: int) -> list[Component]:
    """Decoder-layer weights: split, replicated, and the routed experts ``tokens`` touch."""
    groups = model.layer_groups
    replicated = sum(g.count * model.replicated_layer_params(g) for g in groups)
    routed = sum(g.count * g.ffn.routed_params() for g in groups)
    split = sum(g.count * model.layer_params(g) for g in groups) - replicated - routed
    routed_read = sum(g.count * g.ffn.routed_read_params(tokens) for g in groups)
    parts = [
        Component("weights/layers", ComponentKind.WEIGHTS, split * wb, split * wb),
        Component("weights/replicated", ComponentKind.WEIGHTS, replicated * wb,
                  replicated * wb, is_replicated=True),
    ]
    if routed:
        parts.append(Component("weights/routed_experts", ComponentKind.WEIGHTS, routed * wb,
                               routed_read * wb, kernel=Kernel.EXPERTS))
    return parts


def _weight_components(model: ModelSpec, tokens: int, precision: Precision) -> list[Component]:
    """Decoder layers, embedding and head for ``tokens`` tokens."""
    wb = precision.weight_bytes
    embedding = model.embedding_params()
    # The embedding is gathered row by row; a tied embedding is read whole by the LM head.
    rows = model.vocab_size if model.tie_embeddings else min(tokens, model.vocab_size)
    return [
        *_layer_components(model, tokens, wb),
        Component("weights/embedding", ComponentKind.WEIGHTS, embedding * wb,
                  rows * model.hidden_size * wb),
        Component("weights/head", ComponentKind.WEIGHTS, model.head_params() * wb,
                  model.head_params() * wb),
    ]


def _dense_flops_per_token(model: ModelSpec) -> int:
    """Matmul FLOPs of one token outside attention's QK^T and PV, LM head excluded."""
    return sum(
        g.count * (2 * model.attention.params() + g.ffn.flops_per_token())
        for g in model.layer_groups
    )


def _replicated_flops_per_token(model: ModelSpec) -> int:
    """Matmul FLOPs of one token in the replicated matrices (norms are not matmuls)."""
    return sum(
        g.count * 2 * (model.attention.replicated_params() + g.ffn.replicated_params())
        for g in model.layer_groups
    )


def _head_flops(model: ModelSpec) -> int:
    return 2 * model.vocab_size * model.hidden_size


def decode_work(model: ModelSpec, batch: int, cache_tokens: int, precision: Precision) -> Work:
    """One decode step: ``batch`` sequences each attend over ``cache_tokens`` cached tokens."""
    kv_token = model.kv_elements_per_token() * precision.kv_bytes
    kv_sequence = model.kv_elements(cache_tokens) * precision.kv_bytes
    kv = Component(
        "kv_cache", ComponentKind.KV_CACHE,
        resident_bytes=batch * kv_sequence,
        read_bytes=batch * kv_sequence,
        write_bytes=batch * kv_token,  # the new token's K/V (a ring slot for snapstream)
    )
    attention = model.decode_attention_flops(cache_tokens)
    flops = batch * (_dense_flops_per_token(model) + attention + _head_flops(model))
    replicated = batch * _replicated_flops_per_token(model)
    return Work((*_weight_components(model, batch, precision), kv), flops, batch, replicated)


def prefill_work(model: ModelSpec, batch: int, prompt_len: int, precision: Precision) -> Work:
    """Prefill of ``batch`` prompts of ``prompt_len`` tokens, weights read once, causal
    attention over every (query, key) pair, logits for the last position only. The full KV of
    the prompt is written whatever the policy (SnapKV compresses it afterwards)."""
    tokens = batch * prompt_len
    kv_written = tokens * model.kv_elements_per_token() * precision.kv_bytes
    kv = Component("kv_cache", ComponentKind.KV_CACHE, kv_written, 0.0, kv_written)
    attention = batch * model.prefill_pairs(prompt_len) * model.attention.pair_flops()
    flops = tokens * _dense_flops_per_token(model) + attention + batch * _head_flops(model)
    replicated = tokens * _replicated_flops_per_token(model)
    return Work((*_weight_components(model, tokens, precision), kv), flops, tokens, replicated)


def activation_bytes_per_socket(
    model: ModelSpec, tokens: int, sockets: int, precision: Precision
) -> int:
    """On-chip working set of one layer on one socket: double-buffered activations (the
    residual stream is replicated, the widest projection is split) plus fp32 logits."""
    widest = max(
        max(model.attention.width(), g.ffn.width()) for g in model.layer_groups
    )
    per_token = model.hidden_size + math.ceil(widest / sockets)
    logits = tokens * math.ceil(model.vocab_size / sockets) * DTYPE_BYTES[DType.FP32]
    return 2 * tokens * per_token * precision.activation_bytes + logits
