"""Cache policies: what a sequence keeps, as one slot layout shared by prefill and decode.

Every policy maps to a :class:`CacheLayout` of ``n_sink | n_topk | n_ring`` slots per layer and
KV head. A token at absolute position ``p`` is written to slot ``p`` while ``p < n_sink + n_topk``
and to ring slot ``n_sink + n_topk + (p - n_sink - n_topk) % n_ring`` after that, so a new token
always overwrites the oldest ring entry and nothing is evicted until the layout is full. When the
prompt is longer than ``n_sink + n_topk + n_recent``, prefill keeps the first ``n_sink`` tokens,
``n_topk`` tokens chosen by SnapKV and the last ``n_recent`` prompt tokens (see compress.py).

| kind       | SnapKV n_topk | n_recent kept     | n_ring (decode)      | size  |
|------------|---------------|-------------------|----------------------|-------|
| full       | 0             | whole prompt      | prompt + max_new     | grows |
| streaming  | 0             | n_topk + n_recent | n_topk + n_recent    | fixed |
| snapkv     | n_topk        | n_recent          | n_recent + max_new   | grows |
| snapstream | n_topk        | n_recent          | n_recent             | fixed |

Streaming spends the ``n_topk`` part of the budget on a longer ring, so every policy compared at
the same (n_sink, n_topk, n_recent) holds the same number of tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Protocol

POOLINGS = ("avg", "max")
# whose queries SnapKV's window holds: "last", the prompt's last ``observation``; "opening", those
# and a probe's, the last turn's opening and closing read again after the prompt (engine.py)
OBSERVES = ("last", "opening")
# what SnapKV keeps whole: "token", each key alone; "word", a word's tokens together (units.py)
UNITS = ("token", "word")
# the integer fields of a CachePolicy: what a request may set besides ``kind`` and ``pooling``
SIZE_FIELDS = ("n_sink", "n_topk", "n_recent", "observation", "kernel")


@dataclass(frozen=True)
class CacheLayout:
    """Slot layout of one sequence: ``budget`` slots per layer and KV head."""

    n_sink: int
    n_topk: int
    n_recent: int
    n_ring: int

    def __post_init__(self) -> None:
        if min(self.n_sink, self.n_topk) < 0 or not 1 <= self.n_recent <= self.n_ring:
            raise ValueError(f"invalid cache layout {self}: need n_sink, n_topk >= 0 and "
                             "1 <= n_recent <= n_ring")

    @property
    def budget(self) -> int:
        return self.n_sink + self.n_topk + self.n_ring

    @property
    def ring_start(self) -> int:
        return self.n_sink + self.n_topk

    @property
    def n_kept(self) -> int:
        """Prompt tokens kept when prefill compresses (and the longest prompt it does not)."""
        return self.ring_start + self.n_recent

    def compresses(self, prompt_len: int) -> bool:
        return prompt_len > self.n_kept

    def slot_of(self, position: int) -> int:
        """Slot that holds absolute ``position`` when it is written."""
        if position < self.ring_start:
            return position
        return self.ring_start + (position - self.ring_start) % self.n_ring


@dataclass(frozen=True)
class CachePolicy:
    """Per-request cache policy. Sizes are in tokens per layer and KV head."""

    kind: str = "snapstream"
    n_sink: int = 4
    n_topk: int = 764
    n_recent: int = 256
    observation: int = 32  # SnapKV's observation window: the last prompt queries that vote
    kernel: int = 5
    pooling: str = "avg"
    observe: str = "last"  # OBSERVES
    unit: str = "token"  # UNITS

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise ValueError(
                f"kind: unknown policy {self.kind!r} (use one of {list(POLICY_KINDS)})"
            )
        for name in ("n_sink", "n_topk", "n_recent"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.n_recent < 1:
            raise ValueError("n_recent must be >= 1: decode writes new tokens into the ring")
        if self.observation < 1 or self.observation > self.budget:
            raise ValueError(f"observation must be in [1, budget={self.budget}], got "
                             f"{self.observation}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"kernel must be a positive odd number, got {self.kernel}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.observe not in OBSERVES:
            raise ValueError(f"observe must be one of {OBSERVES}, got {self.observe!r}")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")

    @property
    def budget(self) -> int:
        return self.n_sink + self.n_topk + self.n_recent

    @property
    def spec(self) -> KindSpec:
        return POLICY_KINDS[self.kind]

    @property
    def is_fixed_size(self) -> bool:
        return self.spec.is_fixed_size

    def check_context(self, context_len: int) -> None:
        """ValueError when this policy cannot run on a model with ``context_len`` positions.
        Every size is bounded by it: the budget (except under ``full``, which keeps the whole
        prompt and ignores the sizes), the observation window by the budget, and the pooling
        kernel by the
        context (no prompt is longer, and pooling costs prompt length x kernel)."""
        if self.spec.is_sized and self.budget > context_len:
            raise ValueError(
                f"budget n_sink+n_topk+n_recent={self.budget} exceeds the model's context of "
                f"{context_len} tokens; lower n_topk or n_recent"
            )
        if self.kernel > context_len:
            raise ValueError(f"kernel must be at most the model's context of {context_len} "
                             f"tokens, got {self.kernel}")

    def layout(self, prompt_len: int, max_new_tokens: int, capacity: int | None = None
               ) -> CacheLayout:
        """Slot layout for one request. A growing policy holds prompt + max_new_tokens tokens, or
        ``capacity`` when given: serving uses the model's context, so that every request of a
        kind shares one pool shape."""
        is_growing = not self.spec.is_fixed_size
        if is_growing and capacity is not None and prompt_len + max_new_tokens > capacity:
            raise ValueError(f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) "
                             f"exceeds the capacity of {capacity} tokens")
        return self.spec.layout(self, prompt_len, max_new_tokens, capacity)


# the fields a kind is defined by: a request for it that leaves them unset gets these, not the
# model default's (tuned for the default's kind; SmolLM2's snapstream default has no sinks)
KIND_OWN_FIELDS: dict[str, dict[str, int]] = {"streaming": {"n_sink": 4}}  # StreamingLLM


def resolve_policy(default: CachePolicy, given: dict) -> CachePolicy:
    """A request's policy: the fields it ``given`` (``kind`` among them), the rest the model's
    ``default``'s, except that a kind other than the default's first takes its own defining
    fields (:data:`KIND_OWN_FIELDS`): ``streaming`` asked of a sinkless default is still
    StreamingLLM, with its 4 sinks. Raises ValueError naming a bad field."""
    kind = given.get("kind", default.kind)
    own = KIND_OWN_FIELDS.get(kind, {}) if kind != default.kind else {}
    return replace(default, **(own | given))


POLICY_FILE = "snapstream_policy.json"


def load_default_policy(file: Path) -> CachePolicy:
    """The cache policy a model is served with unless a request says otherwise:
    :class:`CachePolicy`'s defaults, overridden by the fields of the model's policy file when it
    exists (a checkpoint directory's ``snapstream_policy.json``, or for a GGUF file the shipped
    ``snapstream/policies/<sha256>.json``)."""
    if not file.exists():
        return CachePolicy()
    given = json.loads(file.read_text())
    known = {field.name for field in fields(CachePolicy)}
    if not isinstance(given, dict) or set(given) - known:
        raise ValueError(f"{file}: expected an object with fields among {sorted(known)}, "
                         f"got {given!r}")
    try:
        return CachePolicy(**given)
    except ValueError as exc:
        raise ValueError(f"{file}: {exc}") from None


class KindSpec(Protocol):
    is_fixed_size: bool
    is_sized: bool  # whether n_sink, n_topk and n_recent shape the layout

    def layout(self, policy: CachePolicy, prompt_len: int, max_new_tokens: int,
               capacity: int | None) -> CacheLayout: ...


@dataclass(frozen=True)
class _Full:
    is_fixed_size: bool = False
    is_sized: bool = False

    def layout(self, policy: CachePolicy, prompt_len: int, max_new_tokens: int,
               capacity: int | None) -> CacheLayout:
        size = capacity or prompt_len + max_new_tokens
        return CacheLayout(n_sink=0, n_topk=0, n_recent=size, n_ring=size)


@dataclass(frozen=True)
class _Streaming:
    is_fixed_size: bool = True
    is_sized: bool = True

    def layout(self, policy: CachePolicy, prompt_len: int, max_new_tokens: int,
               capacity: int | None) -> CacheLayout:
        ring = policy.n_topk + policy.n_recent
        return CacheLayout(n_sink=policy.n_sink, n_topk=0, n_recent=ring, n_ring=ring)


@dataclass(frozen=True)
class _SnapKV:
    is_fixed_size: bool = False
    is_sized: bool = True

    def layout(self, policy: CachePolicy, prompt_len: int, max_new_tokens: int,
               capacity: int | None) -> CacheLayout:
        ring_start = policy.n_sink + policy.n_topk
        ring = capacity - ring_start if capacity else policy.n_recent + max_new_tokens
        return CacheLayout(policy.n_sink, policy.n_topk, policy.n_recent, ring)


@dataclass(frozen=True)
class _SnapStream:
    is_fixed_size: bool = True
    is_sized: bool = True

    def layout(self, policy: CachePolicy, prompt_len: int, max_new_tokens: int,
               capacity: int | None) -> CacheLayout:
        return CacheLayout(policy.n_sink, policy.n_topk, policy.n_recent, policy.n_recent)


POLICY_KINDS: dict[str, KindSpec] = {
    "full": _Full(),
    "streaming": _Streaming(),
    "snapkv": _SnapKV(),
    "snapstream": _SnapStream(),
}
