"""Evaluation sets: reproducible, validated."""

import contextlib
import io
import os
import subprocess
import sys
from collections import Counter

import pytest

from snapstream.data import TASKS, Split, build_eval_set

DIGEST_SCRIPT = """
import hashlib
from snapstream.data import build_eval_set
samples = build_eval_set(tasks=["kv", "vartrack"], context_lens=[1024], depths=[0.3],
                         n_per_cell=3, seed=11)
print(hashlib.sha256(repr(samples).encode()).hexdigest())
"""


def digest_here() -> str:
    namespace: dict[str, object] = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(DIGEST_SCRIPT, namespace)
    return out.getvalue().strip()


def test_samples_are_identical_in_another_process_with_another_hash_seed():
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", DIGEST_SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == digest_here()


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
