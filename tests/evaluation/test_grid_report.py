"""The grid's report on hand-made rows: 95% intervals, the rows lost against the full cache with
their failure analysis, the accuracy targets; and resumable cells."""

import json
from dataclasses import replace

import pytest
import torch

from evaldata import Needle, Placement, Sample
from evaluation.cells import run_in_cells
from evaluation.needles import attention_share, held_share, needle_tokens
from evaluation.results import (
    Row,
    accuracy_table,
    analysis_table,
    cell_table,
    losses,
    wilson_interval,
)
from evaluation.targets import Target, check_targets
from snapstream.kvcache import EMPTY


def row(sample: int, policy: str, label: str | None, correct: bool, task: str = "kv",
        answer_kept: float | None = None) -> Row:
    budget = {"1/4": 128, "1/8": 64, None: None}[label]
    return Row(sample=sample, task=task, context_len=512, depth=0.5, placement="after", gap=0,
               policy=policy, budget_label=label, budget=budget,
               budget_fraction=None if budget is None else budget / 512, n_sink=4,
               n_topk=92, n_recent=32, observation=32, kernel=7, pooling="avg", correct=correct,
               answer="AB12", generated="AB12" if correct else "CD34", prompt_tokens=500,
               new_tokens=3, finish_reason="verdict", forced_nll=None,
               needle_kept=answer_kept, answer_kept=answer_kept,
               needle_attention=None if answer_kept is None else answer_kept / 10)


ROWS = [
    row(0, "full", None, True), row(1, "full", None, True), row(2, "full", None, False),
    row(0, "snapstream", "1/4", True, answer_kept=1.0),
    row(1, "snapstream", "1/4", False, answer_kept=0.25),
    row(2, "snapstream", "1/4", False, answer_kept=0.5),  # full missed it too: not a loss
]


@pytest.mark.parametrize(("correct", "n"), [(0, 10), (5, 10), (10, 10), (43, 86)])
def test_wilson_interval_holds_the_share_and_is_symmetric(correct, n):
    low, high = wilson_interval(correct, n)
    assert 0.0 <= low <= correct / n <= high <= 1.0 and high - low > 0
    assert wilson_interval(n - correct, n) == pytest.approx((1 - high, 1 - low))


def test_wilson_interval_of_43_samples_is_within_15_points_at_half():
    low, high = wilson_interval(22, 43)
    assert high - low < 0.30 and wilson_interval(22, 42)[1] - wilson_interval(22, 42)[0] < 0.31


def test_accuracy_entries_carry_their_interval():
    entry = next(e for e in accuracy_table(ROWS, ()) if e["policy"] == "snapstream")
    assert (entry["ci_low"], entry["ci_high"]) == wilson_interval(1, 3)


def test_losses_are_the_rows_full_answered_and_the_run_did_not():
    assert losses(ROWS) == [ROWS[4]]
    (snap,) = [e for e in analysis_table(ROWS) if e["policy"] == "snapstream"]
    assert (snap["n_right"], snap["n_lost"]) == (1, 1)
    assert (snap["answer_kept_right"], snap["answer_kept_lost"]) == (1.0, 0.25)
    assert snap["needle_attention_lost"] == pytest.approx(0.025)


def test_cell_table_shows_each_run_with_its_interval():
    summary = {"by_task_length": accuracy_table(ROWS, ("task", "context_len", "placement",
                                                       "gap"))}
    table = cell_table(summary)
    low, high = wilson_interval(2, 3)
    assert f"| kv | 512 | after | 0.67 [{low:.2f}, {high:.2f}] (3) |" in table


def test_targets_are_checked_where_full_reaches_half():
    rows = [row(i, "full", None, i < 8) for i in range(10)]  # full 0.8
    rows += [row(i, "snapstream", "1/4", i < 7) for i in range(10)]  # 0.7: 0.875 x full
    rows += [row(i, "streaming", "1/4", i < 3) for i in range(10)]
    rows += [replace(r, task="niah", correct=r.policy != "full" or r.sample < 4) for r in rows]
    by_cell = accuracy_table(rows, ("task", "context_len", "placement", "gap"))
    checks = check_targets(by_cell, (Target("snapstream", "1/4", "full", 0.95),
                                     Target("snapstream", "1/4", "streaming", 1.0),
                                     Target("snapstream", "1/8", "full", 0.85)))
    assert [(c["target"].split(" >=")[0], c["task"], c["is_met"]) for c in checks] == [
        ("snapstream 1/4", "kv", False), ("snapstream 1/4", "kv", True)]  # niah: full 0.4


def _sample() -> Sample:
    prompt = "intro. The code for red-owl is 4711. filler text. Question?"
    fact = "The code for red-owl is 4711."
    return Sample(task="niah", prompt=prompt, answers=("4711",), question="Question?", cue="",
                  context_len=128, depth=0.5, placement=Placement.AFTER,
                  needles=(Needle(fact, prompt.index(fact), True),), num_tokens=12,
                  body=prompt)


def test_needle_tokens_cover_the_needle_and_the_answer_inside_it():
    sample = _sample()
    words = [(m, m + len(w)) for m, w in _words(sample.prompt)]  # one token a word
    where = needle_tokens(words, sample)
    texts = [sample.prompt[a:b] for a, b in words]
    assert [texts[i] for i in where.needle] == ["The", "code", "for", "red-owl", "is", "4711."]
    assert [texts[i] for i in where.answer] == ["4711."]


def _words(text: str) -> list[tuple[int, str]]:
    out, at = [], 0
    for word in text.split(" "):
        out.append((at, word))
        at += len(word) + 1
    return out


class _Group:
    def __init__(self, positions):
        self.positions = positions


class _Cache:
    def __init__(self, positions):
        self.groups = (_Group(positions),)


def test_held_share_and_attention_share_on_crafted_tensors():
    positions = torch.tensor([[[0, 1, 5, EMPTY], [0, 2, 5, 6]]])  # (L=1, Hkv=2, S=4)
    cache = _Cache(positions)
    assert held_share(cache, (5,)) == 1.0 and held_share(cache, (1, 2)) == 0.5
    assert held_share(cache, (9,)) == 0.0 and held_share(cache, ()) is None
    votes = torch.tensor([[[1.0, 1.0, 2.0, float("inf")]], [[4.0, 0.0, 0.0, float("inf")]]])
    # layer 0: 2 of 4 votes on token 2 (the window's own +inf key left out); layer 1 sliding
    assert attention_share(votes, (None, 512), (2,)) == pytest.approx(0.5)
    assert attention_share(votes, (None, None), (2,)) == pytest.approx(0.25)


def test_cells_are_run_once_and_read_back(tmp_path):
    samples = [_sample(), replace(_sample(), task="kv"), replace(_sample(), task="kv")]
    calls = []

    def run(indices, members):
        calls.append(indices)
        return [row(i, "full", None, True, task=s.task) for i, s in zip(indices, members,
                                                                       strict=True)], []

    settings = {"model": "m", "tasks": ["niah", "kv"], "seed": 1}
    first, _ = run_in_cells(samples, settings, tmp_path, run, echo=lambda _: None)
    assert calls == [[0], [1, 2]]
    assert sorted(p.name for p in (tmp_path / "cells").iterdir()) == [
        "kv-128-after.json", "niah-128-after.json", "settings.json"]
    grown = {**settings, "tasks": ["niah", "kv", "codesearch"]}  # a grid axis may change
    again, _ = run_in_cells(samples, grown, tmp_path, run, echo=lambda _: None)
    assert again == first and len(calls) == 2
    (tmp_path / "cells" / "kv-128-after.json").unlink()
    run_in_cells(samples, settings, tmp_path, run, echo=lambda _: None)
    assert calls[-1] == [1, 2]
    with pytest.raises(ValueError, match="seed"):
        run_in_cells(samples, {**settings, "seed": 2}, tmp_path, run, echo=lambda _: None)
    assert json.loads((tmp_path / "cells" / "settings.json").read_text())["seed"] == 1


def test_a_keep_share_beside_a_budget_leaves_the_axis_to_the_budgets_label():
    """A speculative run's kept share (0.2422 here) sits beside the 1/4 budget; the axis names
    the budgets alone, so the two labels do not overprint each other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from evaluation.plots import _budget_panel

    kept = replace(row(0, "speculative", "1/4", True), budget_label="keep 0.25", budget=124,
                   budget_fraction=124 / 512)
    rows = [*ROWS, row(0, "snapstream", "1/8", True), kept]
    fig, ax = plt.subplots()
    _budget_panel(ax, accuracy_table(rows, ("task", "placement")))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1/8", "1/4"]
    plt.close(fig)
    fig, ax = plt.subplots()  # a grid of keep shares alone is labelled by them
    _budget_panel(ax, accuracy_table([*ROWS[:3], kept], ("task", "placement")))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["keep 0.25"]
    plt.close(fig)
