"""Training mixture and evaluation sets: reproducible, index-addressable, validated."""

import contextlib
import io
import os
import subprocess
import sys
from collections import Counter

import pytest

from snapstream.data import TASKS, Placement, Split, TrainingMixture, build_eval_set
from snapstream.data.tasks import min_context_len

DIGEST_SCRIPT = """
import hashlib
from snapstream.data import TrainingMixture, build_eval_set
samples = [TrainingMixture(seed=11)[i] for i in range(40)]
samples += build_eval_set(tasks=["kv", "vartrack"], context_lens=[1024], depths=[0.3],
                          n_per_cell=3, seed=11)
print(hashlib.sha256(repr(samples).encode()).hexdigest())
"""


def digest_here() -> str:
    namespace: dict[str, object] = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(DIGEST_SCRIPT, namespace)
    return out.getvalue().strip()


def test_sample_depends_only_on_seed_and_index():
    mixture = TrainingMixture(seed=3)
    forward = [mixture[i] for i in range(30)]
    backward = [TrainingMixture(seed=3)[i] for i in reversed(range(30))][::-1]
    assert forward == backward
    assert list(zip(range(5), mixture.stream(start=10), strict=False)) == [
        (i, mixture[10 + i]) for i in range(5)
    ]
    assert TrainingMixture(seed=4)[0] != mixture[0]


def test_samples_are_identical_in_another_process_with_another_hash_seed():
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", DIGEST_SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == digest_here()


def test_mixture_draws_within_its_ranges():
    mixture = TrainingMixture(
        seed=0, weights={"passkey": 1.0, "kv": 3.0, "multikey": 0.0},
        context_len_range=(600, 900), depth_range=(0.2, 0.4), before_fraction=0.25,
    )
    samples = [mixture[i] for i in range(400)]
    tasks = Counter(sample.task for sample in samples)
    assert set(tasks) == {"passkey", "kv"} and tasks["kv"] > 2 * tasks["passkey"]
    assert all(sample.split is Split.TRAIN for sample in samples)
    assert all(600 <= sample.context_len <= 900 for sample in samples)
    assert all(0.2 <= sample.depth <= 0.4 for sample in samples)
    num_before = sum(sample.placement is Placement.BEFORE for sample in samples)
    assert 60 <= num_before <= 140


def test_default_mixture_fits_its_shortest_context():
    mixture = TrainingMixture(seed=1, context_len_range=(512, 512))
    samples = [mixture[i] for i in range(300)]
    assert {sample.task for sample in samples} == set(TASKS)
    assert all(len(sample.prompt) <= 512 for sample in samples)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"weights": {"haystack": 1.0}}, "weights"),
        ({"weights": {"kv": 0.0}}, "weights"),
        ({"weights": {}}, "weights"),
        ({"context_len_range": (900, 600)}, "context_len_range"),
        ({"context_len_range": (64, 600)}, "context_len_range"),
        ({"depth_range": (0.5, 1.5)}, "depth_range"),
        ({"before_fraction": 2.0}, "before_fraction"),
        ({"max_distractors": -1}, "max_distractors"),
        ({"max_hops": 0}, "max_hops"),
    ],
)
def test_bad_mixture_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        TrainingMixture(seed=0, **overrides)


def test_mixture_too_short_for_a_task_names_it_and_the_length_it_needs():
    need = min_context_len("vartrack", Split.TRAIN, 3, 3)
    with pytest.raises(ValueError, match=f"vartrack with up to 3 distractors and 3 hops needs "
                                         f"{need}"):
        TrainingMixture(seed=0, context_len_range=(need - 1, 900))
    TrainingMixture(seed=0, context_len_range=(need, 900))
    TrainingMixture(seed=0, context_len_range=(need - 1, 900), max_hops=2)
    TrainingMixture(seed=0, context_len_range=(need - 1, 900), weights={"passkey": 1.0})


def test_mixture_weights_are_frozen_and_order_free():
    weights = {"kv": 1.0, "passkey": 2.0}
    mixture = TrainingMixture(seed=5, weights=weights)
    weights["kv"] = 100.0
    assert mixture.weights["kv"] == 1.0
    assert mixture[9] == TrainingMixture(seed=5, weights={"passkey": 2.0, "kv": 1.0})[9]
    with pytest.raises(IndexError):
        mixture[-1]


def test_eval_set_covers_every_cell_reproducibly():
    grid = {"tasks": list(TASKS), "context_lens": [512, 1024], "depths": [0.0, 0.5, 1.0]}
    samples = build_eval_set(**grid, n_per_cell=2, seed=9)
    assert samples == build_eval_set(**grid, n_per_cell=2, seed=9)
    assert len(samples) == 4 * 2 * 3 * 2 * 2
    cells = Counter((s.task, s.context_len, s.depth, s.placement) for s in samples)
    assert set(cells.values()) == {2}
    assert all(sample.split is Split.HELDOUT for sample in samples)
    assert samples != build_eval_set(**grid, n_per_cell=2, seed=10)


def test_growing_the_grid_keeps_existing_samples():
    small = build_eval_set(tasks=["kv"], context_lens=[1024], depths=[0.5], n_per_cell=2, seed=1)
    large = build_eval_set(
        tasks=["passkey", "kv"], context_lens=[512, 1024], depths=[0, 0.5], n_per_cell=3, seed=1
    )
    assert all(sample in large for sample in small)


def test_eval_set_rejects_empty_cells():
    with pytest.raises(ValueError, match="n_per_cell"):
        build_eval_set(tasks=["kv"], context_lens=[512], depths=[0.5], n_per_cell=0, seed=0)
