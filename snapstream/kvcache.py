"""KV cache containers in slot layout: one sequence, and the fixed pool the decoder batches over.

A model's layers fall into **layer groups**, one per distinct slot layout (:class:`ModelLayout`):
a Llama-family model has one group (every layer in the policy's layout); a hybrid model such as
Gemma 3 has its global layers in the policy's layout and its sliding-window layers in a ring of
exactly their window (slot = position % window, nothing compressed, for every policy: the model
was trained to see no more). Each group owns its K/V/positions tensors, so every group has one
static shape.

Keys are stored already rotated at their absolute positions, so slot order is irrelevant to
attention; ``positions`` holds each slot's absolute position, ``-1`` for an empty slot. K and V
are stored in a KV dtype of :mod:`snapstream.kvquant`: a slot's row is its D values (float32,
bfloat16) or D int8 codes and their scale (int8, a row of D + 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from snapstream.config import ModelConfig
from snapstream.kvquant import kv_codec, kv_slot_bytes, to_kv
from snapstream.policy import CacheLayout

EMPTY = -1


def window_layout(window: int) -> CacheLayout:
    """A sliding-window layer's exact cache: a ring of ``window`` slots, slot = position % window.
    After a token is written it holds that token and the ``window - 1`` before it, which is what
    a query of such a layer attends to (its own key included)."""
    return CacheLayout(n_sink=0, n_topk=0, n_recent=window, n_ring=window)


@dataclass(frozen=True)
class LayerGroup:
    """Layers that share one slot layout."""

    layers: tuple[int, ...]  # ascending layer indices
    layout: CacheLayout
    window: int | None = None  # the sliding window of these layers; None: global layers


@dataclass(frozen=True)
class ModelLayout:
    """The slot layout of every layer of a model for one request: its layer groups, the global
    layers' group first (the policy's layout), then one group per sliding window."""

    groups: tuple[LayerGroup, ...]

    def __post_init__(self) -> None:
        layers = sorted(i for group in self.groups for i in group.layers)
        if not self.groups or layers != list(range(len(layers))):
            raise ValueError(f"layer groups must cover layers 0..L-1 once each, got {self}")

    @classmethod
    def build(cls, windows: tuple[int | None, ...], layout: CacheLayout) -> ModelLayout:
        """``windows``: per layer, its sliding window or None (a global layer; a model's
        ``config.attention_windows``); ``layout``: the policy's, for the global layers."""
        groups = [LayerGroup(tuple(i for i, w in enumerate(windows) if w is None), layout)]
        for window in sorted({w for w in windows if w is not None}):
            layers = tuple(i for i, w in enumerate(windows) if w == window)
            groups.append(LayerGroup(layers, window_layout(window), window))
        return cls(tuple(group for group in groups if group.layers))

    @property
    def num_layers(self) -> int:
        return sum(len(group.layers) for group in self.groups)

    @property
    def num_slots(self) -> int:
        """Slots per KV head over every layer (what a sequence's cache holds, per KV head)."""
        return sum(len(group.layers) * group.layout.budget for group in self.groups)

    @property
    def global_slots(self) -> int:
        """Slots per global layer and KV head (the policy's budget); 0 if every layer slides."""
        return next((g.layout.budget for g in self.groups if g.window is None), 0)


@dataclass(frozen=True)
class GroupKV:
    """One layer group's cache of one sequence."""

    group: LayerGroup
    k: torch.Tensor  # (Lg, Hkv, S, W), Lg = len(group.layers), S = group.layout.budget, W: row
    v: torch.Tensor  # (Lg, Hkv, S, W)                  width of the KV dtype (D; int8: D + 4)
    positions: torch.Tensor  # (Lg, Hkv, S) int32, EMPTY where unused

    def __post_init__(self) -> None:
        num_layers, num_kv_heads, num_slots, _ = self.k.shape
        if (num_layers, num_slots) != (len(self.group.layers), self.group.layout.budget) \
                or self.v.shape != self.k.shape:
            raise ValueError(f"cache tensors {tuple(self.k.shape)} do not match {self.group}")
        if self.positions.shape != (num_layers, num_kv_heads, num_slots):
            raise ValueError(f"positions {tuple(self.positions.shape)} do not match the keys")


@dataclass(frozen=True)
class SequenceCache:
    """The KV cache of one sequence; its tensor shapes depend only on the model and the layout.

    Built from one :class:`GroupKV` per group of a :class:`ModelLayout`, in its order, e.g.
    ``SequenceCache((GroupKV(group, k, v, positions), ...), prompt_len, next_position)``;
    :func:`snapstream.compress.build_sequence_cache` builds one from a prompt's whole K/V.
    """

    groups: tuple[GroupKV, ...]
    prompt_len: int
    next_position: int  # absolute position of the next token to be written

    def __post_init__(self) -> None:
        self.layout  # noqa: B018 -- validates that the groups cover every layer once
        if not 0 < self.prompt_len <= self.next_position:
            raise ValueError(f"need 0 < prompt_len <= next_position, got {self.prompt_len}, "
                             f"{self.next_position}")

    @property
    def layout(self) -> ModelLayout:
        return ModelLayout(tuple(part.group for part in self.groups))

    @property
    def num_tokens_held(self) -> int:
        """Tokens the global layers hold (the first group's, for a model with none)."""
        return int((self.groups[0].positions[0, 0] != EMPTY).sum())


@dataclass(frozen=True)
class BatchGroupKV:
    """One layer group's slice of a pool: ``batch_size`` rows. Which slots hold a token is the
    same for every layer and KV head of a group (its layout fills them alike, and decode writes
    the same slot in all of them), so the pool keeps one (B, S) mask, not the sequences'
    per-layer, per-head positions (a blob keeps those; decode never reads them)."""

    group: LayerGroup
    k: torch.Tensor  # (Lg, B, Hkv, S, W)
    v: torch.Tensor  # (Lg, B, Hkv, S, W)
    filled: torch.Tensor  # (B, S) bool, True where a slot holds a token


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """K and V of every layer and KV head for one token of a full cache in ``dtype``."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype.itemsize


def pool_row_bytes(config: ModelConfig, layout: ModelLayout, dtype: torch.dtype) -> int:
    """Bytes one row (one sequence) of a :class:`BatchCache` in KV dtype ``dtype`` holds: K and
    V of every layer, KV head and slot, and its slot mask per layer group."""
    kv = layout.num_slots * config.num_kv_heads * kv_slot_bytes(dtype, config.head_dim)
    return kv + sum(group.layout.budget for group in layout.groups)


class BatchCache:
    """A fixed pool of ``batch_size`` rows sharing one layout: every decode step sees one shape
    per layer group. K/V are held in the KV dtype ``dtype`` (:mod:`snapstream.kvquant`)."""

    def __init__(
        self, config: ModelConfig, layout: ModelLayout, batch_size: int, dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.layout = layout
        width = kv_codec(dtype).row_width(config.head_dim)
        groups = []
        for group in layout.groups:
            shape = (len(group.layers), batch_size, config.num_kv_heads, group.layout.budget,
                     width)
            groups.append(BatchGroupKV(
                group, k=torch.zeros(shape, dtype=dtype, device=device),  # (Lg, B, Hkv, S, W)
                v=torch.zeros(shape, dtype=dtype, device=device),
                filled=torch.zeros(batch_size, group.layout.budget, dtype=torch.bool,
                                   device=device)))
        self.groups = tuple(groups)

    @property
    def batch_size(self) -> int:
        return self.groups[0].k.shape[1]

    def insert(self, row: int, seq: SequenceCache) -> None:
        """Copies ``seq`` into ``row``, converted to the pool's KV dtype where it has another
        (quantized here if the pool is int8 and ``seq`` float; int8 rows are copied as they are)."""
        if seq.layout != self.layout:
            raise ValueError(f"sequence layout {seq.layout} does not match the pool's "
                             f"{self.layout}")
        for pool, part in zip(self.groups, seq.groups, strict=True):
            pool.k[:, row].copy_(to_kv(part.k, pool.k.dtype))
            pool.v[:, row].copy_(to_kv(part.v, pool.v.dtype))
            pool.filled[row].copy_(part.positions[0, 0] != EMPTY)

    def clear(self, row: int) -> None:
        for pool in self.groups:
            pool.filled[row].fill_(False)
