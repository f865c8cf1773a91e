"""Accuracy tables, relative-to-full and the printed summary, on hand-made rows."""

import csv

from evaluation.results import (
    COLUMNS,
    Row,
    accuracy_table,
    markdown_header,
    markdown_row,
    summary_table,
    write_csv,
)


def row(policy: str, label: str | None, placement: str, correct: bool, task: str = "kv",
        gap: int = 0, forced_nll: float | None = 1.5) -> Row:
    budget = {"1/4": 128, None: None}[label]
    return Row(sample=0, task=task, context_len=512, depth=0.5, placement=placement, gap=gap,
               policy=policy, budget_label=label, budget=budget,
               budget_fraction=None if budget is None else budget / 512, n_sink=4,
               n_topk=92, n_recent=32, observation=32, kernel=7, pooling="avg", correct=correct,
               answer="AB12", generated='AB12, "x"' if not correct else "AB12",
               prompt_tokens=500, new_tokens=3, finish_reason="verdict", forced_nll=forced_nll)


ROWS = [
    row("full", None, "after", True), row("full", None, "after", True),
    row("snapstream", "1/4", "after", True), row("snapstream", "1/4", "after", False),
    row("full", None, "before", False), row("snapstream", "1/4", "before", True),
]


def test_accuracy_and_relative_to_full():
    table = {(e["placement"], e["policy"]): e for e in accuracy_table(ROWS, ("placement",))}
    after = table[("after", "snapstream")]
    assert (after["n"], after["correct"], after["accuracy"]) == (2, 1, 0.5)
    assert after["full_accuracy"] == 1.0 and after["relative_to_full"] == 0.5
    assert after["budget_fraction"] == 0.25
    assert table[("after", "full")]["relative_to_full"] == 1.0
    assert table[("before", "full")]["budget_fraction"] is None
    assert table[("before", "snapstream")]["relative_to_full"] is None  # full got none right


def test_summary_table_lists_placements_per_cell():
    summary = {"config": {"tasks": ["kv"]},
               "by_task": accuracy_table(ROWS, ("task", "placement", "gap")),
               "overall": accuracy_table(ROWS, ("placement", "gap"))}
    lines = summary_table(summary).splitlines()
    assert lines[0] == "accuracy (after/before)"
    assert lines[1] == "| policy | budget | kv | all |"
    assert lines[3] == "| full | - | 1.00/0.00 | 1.00/0.00 |"
    assert lines[4] == "| snapstream | 1/4 | 0.50/1.00 | 0.50/1.00 |"


def test_csv_round_trip(tmp_path):
    write_csv(ROWS, tmp_path / "results.csv")
    with (tmp_path / "results.csv").open(newline="") as file:
        records = list(csv.DictReader(file))
    assert tuple(records[0]) == COLUMNS
    assert records[0]["budget"] == "" and records[2]["budget"] == "128"
    assert records[3]["generated"] == 'AB12, "x"'


def test_summary_table_names_gaps_when_there_are_several():
    rows = [row("full", None, "after", True), row("full", None, "after", False, gap=64)]
    summary = {"config": {"tasks": ["kv"]},
               "by_task": accuracy_table(rows, ("task", "placement", "gap")),
               "overall": accuracy_table(rows, ("placement", "gap"))}
    lines = summary_table(summary).splitlines()
    assert lines[0] == "accuracy (after gap 0/after gap 64)"
    assert lines[3] == "| full | - | 1.00/0.00 | 1.00/0.00 |"


def test_groups_average_the_forced_nll_of_the_rows_that_have_one():
    rows = [row("snapstream", "1/4", "after", True, forced_nll=1.0),
            row("snapstream", "1/4", "after", False, forced_nll=2.0),
            row("snapstream", "1/4", "after", False, forced_nll=None),
            row("full", None, "after", True, forced_nll=None)]
    table = {e["policy"]: e for e in accuracy_table(rows, ("placement",))}
    assert table["snapstream"]["forced_nll"] == 1.5
    assert table["full"]["forced_nll"] is None


def test_markdown_rows_line_up_with_their_header():
    header = markdown_header(["task", "asked", "full"]).splitlines()
    row = markdown_row(["niah", 3, "2/3"])
    assert header == ["| task | asked | full |", "| --- | --- | --- |"]
    assert row == "| niah | 3 | 2/3 |"
    assert row.count("|") == header[0].count("|") == header[1].count("|")
