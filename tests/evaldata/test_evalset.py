"""Evaluation sets: reproducible from the seed and each sample's address, validated."""

import contextlib
import io
import os
import subprocess
import sys
from collections import Counter

import pytest

from evaldata import TASKS, build_eval_set
from tests.evaldata.helpers import spec

DIGEST_SCRIPT = """
import hashlib
from evaldata import build_eval_set
from tests.evaldata.helpers import spec
samples = build_eval_set(tasks=["kv", "vartrack"], context_lens=[1200], depths=[0.3, 0.6],
                         n_per_cell=3, seed=11, spec=spec("chat"))
print(hashlib.sha256(repr(samples).encode()).hexdigest())
"""


def digest_here() -> str:
    namespace: dict[str, object] = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(DIGEST_SCRIPT, namespace)
    return out.getvalue().strip()


def test_samples_are_identical_in_another_process_with_another_hash_seed():
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT], env=env, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == digest_here()


def test_eval_set_covers_every_cell_and_cycles_depths():
    grid = {"tasks": list(TASKS), "context_lens": [900, 1200], "depths": [0.0, 0.5, 1.0]}
    samples = build_eval_set(**grid, n_per_cell=4, seed=9, spec=spec())
    assert samples == build_eval_set(**grid, n_per_cell=4, seed=9, spec=spec())
    assert len(samples) == len(TASKS) * 2 * 2 * 4
    cells = Counter((s.task, s.context_len, s.placement) for s in samples)
    assert set(cells.values()) == {4}
    first = next(iter(TASKS))
    depths = {n: [s.depth for s in samples if (s.task, s.context_len) == (first, n)][:4]
              for n in (900, 1200)}
    assert depths == {900: [0.5, 1.0, 0.0, 0.5], 1200: [1.0, 0.0, 0.5, 1.0]}  # 900: 10 bits
    assert samples != build_eval_set(**grid, n_per_cell=4, seed=10, spec=spec())


def test_one_sample_per_cell_spreads_needles_over_depths():
    depths = (0.1, 0.3, 0.5, 0.7, 0.9)
    samples = build_eval_set(tasks=list(TASKS), context_lens=[1024, 2048, 4096],
                             depths=depths, placements=["after"], n_per_cell=1, seed=0,
                             spec=spec())
    for n in (1024, 2048, 4096):
        assert {s.depth for s in samples if s.context_len == n} == set(depths)
    for task in TASKS:
        assert len({s.depth for s in samples if s.task == task}) == 3


def test_growing_the_grid_keeps_existing_samples():
    small = build_eval_set(tasks=["kv"], context_lens=[900], depths=[0.5], n_per_cell=2, seed=1,
                           spec=spec())
    large = build_eval_set(tasks=["passkey", "kv"], context_lens=[900, 1200], depths=[0.5],
                           n_per_cell=3, seed=1, spec=spec())
    assert all(sample in large for sample in small)


@pytest.mark.parametrize(("field", "value"), [("n_per_cell", 0), ("depths", [])])
def test_eval_set_rejects_empty_cells(field, value):
    args = {"tasks": ["kv"], "context_lens": [512], "depths": [0.5], "n_per_cell": 1}
    with pytest.raises(ValueError, match=field):
        build_eval_set(**{**args, field: value}, seed=0, spec=spec())
