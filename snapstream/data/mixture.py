"""Training mixture and evaluation sets, reproducible from a seed.

Every sample draws from its own ``random.Random`` seeded with a string naming the sample (string
seeds hash with SHA-512, the same in every process), so a sample depends only on the seed and
its address: the training stream resumes at any index, and growing an evaluation grid keeps the
samples already in it.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from snapstream.data.sample import (
    MAX_DISTRACTORS,
    MAX_HOPS,
    MIN_CONTEXT_LEN,
    Placement,
    Sample,
    Split,
    TaskConfig,
)
from snapstream.data.tasks import TASKS, generate, min_context_len


def _default_weights() -> Mapping[str, float]:
    return dict.fromkeys(TASKS, 1.0)


def _check_between(name: str, value: float, lowest: float, highest: float) -> None:
    if not lowest <= value <= highest:
        raise ValueError(f"{name} must lie in [{lowest}, {highest}], got {value}")


def _check_range(name: str, value: tuple[float, float], lowest: float, highest: float) -> None:
    low, high = value
    if not lowest <= low <= high <= highest:
        raise ValueError(
            f"{name} must be (low, high) with {lowest} <= low <= high <= {highest}, got {value}"
        )


@dataclass(frozen=True)
class TrainingMixture:
    """An endless, index-addressable stream of train-split samples: ``mixture[i]`` depends only
    on ``(seed, i)``. Each sample draws its task by ``weights``, its context length and depth
    uniformly from their ranges, the "before" placement with probability ``before_fraction``,
    ``num_distractors`` from ``0..max_distractors`` and ``num_hops`` from ``1..max_hops``."""

    seed: int
    weights: Mapping[str, float] = field(default_factory=_default_weights)
    context_len_range: tuple[int, int] = (512, 2048)
    depth_range: tuple[float, float] = (0.0, 1.0)
    before_fraction: float = 0.5
    max_distractors: int = 3
    max_hops: int = 3

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(TASKS)
        if unknown or not self.weights:
            raise ValueError(f"weights must name tasks among {', '.join(TASKS)}, got {unknown}")
        numbers = list(self.weights.values())
        if not all(math.isfinite(w) and w >= 0 for w in numbers) or sum(numbers) <= 0:
            raise ValueError(f"weights must be finite, non-negative, not all zero: {numbers}")
        object.__setattr__(self, "weights", MappingProxyType(dict(sorted(self.weights.items()))))
        _check_range("context_len_range", self.context_len_range, MIN_CONTEXT_LEN, math.inf)
        _check_range("depth_range", self.depth_range, 0.0, 1.0)
        _check_between("before_fraction", self.before_fraction, 0.0, 1.0)
        _check_between("max_distractors", self.max_distractors, 0, MAX_DISTRACTORS)
        _check_between("max_hops", self.max_hops, 1, MAX_HOPS)
        for task, weight in self.weights.items():
            need = min_context_len(task, Split.TRAIN, self.max_distractors, self.max_hops)
            if weight > 0 and self.context_len_range[0] < need:
                raise ValueError(
                    f"context_len_range starts at {self.context_len_range[0]} bytes, but {task} "
                    f"with up to {self.max_distractors} distractors and {self.max_hops} hops "
                    f"needs {need}: raise it or lower max_distractors / max_hops")

    def __getitem__(self, index: int) -> Sample:
        if index < 0:
            raise IndexError(f"index must be non-negative, got {index}")
        rng = random.Random(f"mixture/{self.seed}/{index}")
        task = rng.choices(tuple(self.weights), weights=tuple(self.weights.values()))[0]
        is_before = rng.random() < self.before_fraction
        cfg = TaskConfig(
            context_len=rng.randint(*self.context_len_range),
            depth=rng.uniform(*self.depth_range),
            placement=Placement.BEFORE if is_before else Placement.AFTER,
            split=Split.TRAIN,
            num_distractors=rng.randint(0, self.max_distractors),
            num_hops=rng.randint(1, self.max_hops),
        )
        return generate(task, rng, cfg)

    def stream(self, start: int = 0) -> Iterator[Sample]:
        """``self[start], self[start + 1], ...`` without end."""
        return (self[index] for index in itertools.count(start))


def build_eval_set(
    *,
    tasks: Sequence[str],
    context_lens: Sequence[int],
    depths: Sequence[float],
    placements: Sequence[Placement | str] = tuple(Placement),
    n_per_cell: int,
    seed: int,
    split: Split | str = Split.HELDOUT,
    num_distractors: int = 3,
    num_hops: int = 2,
) -> list[Sample]:
    """``n_per_cell`` samples for every (task, context_len, depth, placement) cell, in that
    nesting order; each depends only on ``seed``, its cell and its index in the cell."""
    if n_per_cell < 1:
        raise ValueError(f"n_per_cell must be at least 1, got {n_per_cell}")
    samples = []
    for task, context_len, depth, placement, i in itertools.product(
        tasks, context_lens, depths, placements, range(n_per_cell)
    ):
        cfg = TaskConfig(
            context_len=context_len, depth=depth, placement=placement, split=split,
            num_distractors=num_distractors, num_hops=num_hops,
        )
        address = f"eval/{seed}/{task}/{context_len}/{float(depth)!r}/{cfg.placement}/{i}"
        samples.append(generate(task, random.Random(address), cfg))
    return samples
