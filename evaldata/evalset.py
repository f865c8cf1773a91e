"""Evaluation sets, reproducible from a seed.

Every sample draws from its own ``random.Random`` seeded with a string naming the sample (string
seeds hash with SHA-512, the same in every process), so a sample depends only on the seed and
its address: growing an evaluation grid keeps the samples already in it. Within a cell the
needle depths cycle through ``depths``, starting at an offset fixed by the cell's address (the
task's place in ``TASKS`` plus the bit length of the context length), so a depth x length heat
map needs no extra samples even at one sample per cell: neighbouring tasks and doubled lengths
start at neighbouring depths.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from evaldata.layout import PromptSpec
from evaldata.sample import Placement, Sample, TaskConfig
from evaldata.tasks import TASKS, generate


def build_eval_set(
    *, tasks: Sequence[str], context_lens: Sequence[int], depths: Sequence[float],
    placements: Sequence[Placement | str] = tuple(Placement), n_per_cell: int, seed: int,
    spec: PromptSpec, num_distractors: int = 3, num_hops: int = 2, num_values: int = 3,
) -> list[Sample]:
    """``n_per_cell`` samples for every (task, context_len, placement) cell, in that nesting
    order; each depends only on ``seed``, its cell, its index in the cell and the prompt
    format (the tokenizer decides only how much filler fits)."""
    if n_per_cell < 1:
        raise ValueError(f"n_per_cell must be at least 1, got {n_per_cell}")
    if not depths:
        raise ValueError("depths must not be empty")
    samples = []
    for task, context_len, placement, i in itertools.product(
            tasks, context_lens, placements, range(n_per_cell)):
        cfg = TaskConfig(context_len=context_len,
                         depth=depths[(_depth_offset(task, context_len) + i) % len(depths)],
                         placement=placement, num_distractors=num_distractors,
                         num_hops=num_hops, num_values=num_values)
        address = f"eval/{seed}/{spec.prompt_format}/{task}/{context_len}/{cfg.placement}/{i}"
        samples.append(generate(task, random.Random(address), cfg, spec))
    return samples


def _depth_offset(task: str, context_len: int) -> int:
    return list(TASKS).index(task) + context_len.bit_length()
