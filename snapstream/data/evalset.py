"""Evaluation sets, reproducible from a seed.

Every sample draws from its own ``random.Random`` seeded with a string naming the sample (string
seeds hash with SHA-512, the same in every process), so a sample depends only on the seed and
its address: growing an evaluation grid keeps the samples already in it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from snapstream.data.sample import Placement, Sample, Split, TaskConfig
from snapstream.data.tasks import generate


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
