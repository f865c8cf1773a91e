"""`snapstream eval --draft-model`: speculative rows beside the full baseline, the flags'
validation, through the real CLI registry on tiny random checkpoints."""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import re
from pathlib import Path

import pytest

from cli.main import main
from evaldata import Needle, Placement, Sample
from evaluation import speculative
from evaluation.cli import speculative_from_args
from evaluation.config import EvalConfig, SpeculativeGrid
from evaluation.speculative_report import load_pair, verdict
from evaluation.speculative_runs import needle_kept
from tests.tiny_models import write_tiny_model

GRID = ["--tasks", "passkey,niah", "--context-lens", "600", "--depths", "0.2,0.8",
        "--placements", "after", "--policies", "full", "--n-per-cell", "2", "--no-progress"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    return (write_tiny_model(tmp_path_factory.mktemp("target"), context=1024),
            write_tiny_model(tmp_path_factory.mktemp("draft"), seed=9, context=1024))


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("eval")


@pytest.fixture(scope="module")
def result(models, out_dir) -> tuple[list[dict], dict, str]:
    target, draft = models
    out, stdout = out_dir, io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["eval", "--model", str(target), "--draft-model", str(draft),
                     "--keep", "0.25,1", "--chunk-size", "16", *GRID, "--out", str(out)]) == 0
    with (out / "results.csv").open(newline="") as file:
        records = list(csv.DictReader(file))
    return records, json.loads((out / "summary.json").read_text()), stdout.getvalue()


def test_each_sample_gets_a_row_per_keep_share_beside_full(result, models):
    records, _, _ = result
    runs = [(r["policy"], r["budget_label"]) for r in records]
    assert {run: runs.count(run) for run in runs} == {
        ("full", ""): 4, ("speculative", "keep 0.25"): 4, ("speculative", "keep 1"): 4}
    for record in records:
        if record["policy"] == "speculative":
            assert record["draft"] == str(models[1])
            assert float(record["keep"]) == float(record["budget_label"].split()[1])
        else:
            assert record["draft"] == "" and record["keep"] == ""


def test_the_target_prefills_about_the_keep_share(result):
    records, _, _ = result
    full = {r["sample"]: r for r in records if r["policy"] == "full"}
    for record in records:
        if record["budget_label"] == "keep 0.25":
            prompt = int(full[record["sample"]]["prompt_tokens"])
            assert record["prompt_tokens"] == str(prompt)
            # the ranked chunks fill a quarter; the first and last chunks and the question
            # are kept on top of it
            assert prompt * 0.2 < int(record["budget"]) < prompt * 0.6
            assert float(record["budget_fraction"]) == pytest.approx(
                int(record["budget"]) / prompt)


def test_keeping_everything_answers_as_the_full_prompt(result):
    records, _, _ = result
    full = {r["sample"]: r for r in records if r["policy"] == "full"}
    kept_all = [r for r in records if r["budget_label"] == "keep 1"]
    for record in kept_all:
        base = full[record["sample"]]
        assert record["budget"] == base["prompt_tokens"]
        assert (record["generated"], record["correct"]) == (base["generated"], base["correct"])
        assert float(record["forced_nll"]) == pytest.approx(float(base["forced_nll"]),
                                                            rel=1e-4)


def test_each_speculative_row_says_how_much_of_the_needle_the_target_read(result):
    records, _, _ = result
    for record in records:
        # the full cache holds every prompt token; keeping all of it, so does the draft
        if record["policy"] == "full" or record["budget_label"] == "keep 1":
            assert float(record["needle_kept"]) == 1.0


def test_the_needle_share_counts_the_target_needles_tokens_only():
    """Word tokens; the distractor's tokens, kept or not, do not count."""
    text = "filler words here. The key is 42 now. More filler. The key was 7. End"
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    needle, distractor = "The key is 42 now.", "The key was 7."
    sample = Sample(task="niah", prompt=text, answers=("42",), question="End", cue="",
                    context_len=16, depth=0.5, placement=Placement.AFTER,
                    needles=(Needle(needle, text.index(needle), True),
                             Needle(distractor, text.index(distractor), False)),
                    num_tokens=len(words), body=text)
    first = next(i for i, (a, _) in enumerate(words) if a == text.index(needle))
    other = next(i for i, (a, _) in enumerate(words) if a == text.index(distractor))
    assert needle_kept(text, sample, words, [first, first + 1, other, other + 1]) == 2 / 5
    assert needle_kept(text, sample, words, list(range(first, first + 5))) == 1.0
    assert needle_kept(text, sample, words, [other]) == 0.0


def test_summary_reports_speculative_runs_relative_to_full(result):
    _, summary, stdout = result
    assert summary["config"]["speculative"]["keeps"] == [0.25, 1.0]
    assert summary["config"]["speculative"]["chunk_size"] == 16
    assert summary["config"]["speculative"]["positions"] == "original"  # no sliding layers
    entries = {(e["task"], e["policy"], e["budget_label"]): e for e in summary["by_task"]}
    for task in ("passkey", "niah"):
        spec = entries[task, "speculative", "keep 0.25"]
        assert spec["n"] == 2
        assert spec["full_accuracy"] == entries[task, "full", None]["accuracy"]
    assert "| speculative | keep 0.25 |" in stdout


def test_the_report_tables_every_pair_and_marks_the_target(result, out_dir, models, tmp_path,
                                                          capsys):
    """Two runs of one pair (as one run per length would be) merge: their answers add up."""
    records, _, _ = result
    png = tmp_path / "keep.png"
    speculative.main(["report", str(out_dir), str(out_dir), "--out", str(png)])
    lines = capsys.readouterr().out.splitlines()
    pair = f"{models[1].name} → {models[0].name}"
    assert lines[0] == ("| draft → target | task | length | full | keep 25% | keep 100% | "
                        "keep 25% wrong: needle lost / kept whole | "
                        "skipped (too long for the draft) | keep 25% ≥ 90% of full |")
    right = {label: 2 * sum(r["correct"] == "True" for r in records
                            if r["task"] == "passkey" and r["budget_label"] == label)
             for label in ("", "keep 0.25", "keep 1")}
    wrong = [float(r["needle_kept"]) for r in records if r["task"] == "passkey"
             and r["budget_label"] == "keep 0.25" and r["correct"] == "False"]
    whose = (f"{2 * sum(s < 1 for s in wrong)} / {2 * sum(s == 1 for s in wrong)}"
             if wrong else "")
    mark = ("n.a." if right[""] < 2 else "met" if right["keep 0.25"] >= 0.9 * right[""]
            else "missed")
    expected = (f"| {pair} | **passkey** | all | **{right['']}/4** | "
                f"**{right['keep 0.25']}/4** | **{right['keep 1']}/4** | {whose} |  | {mark} |")
    assert [line for line in lines if "**passkey**" in line] == [expected]
    (niah,) = [line for line in lines if f"| {pair} | niah | 600 |" in line]
    assert niah.count("/4") == 3  # full and both keep shares over 4 samples
    assert png.read_bytes().startswith(b"\x89PNG")


def test_a_sample_longer_than_the_drafts_context_is_skipped_and_said(models, tmp_path,
                                                                    capsys):
    """The draft reads each prompt through its chat template: the 600-token prompts do not fit
    its 500 tokens, the 300-token ones do; the run goes on, and the report counts the skips."""
    short_draft = write_tiny_model(tmp_path / "draft", seed=9, context=500)
    grid = ["--tasks", "passkey", "--context-lens", "300,600", "--depths", "0.5",
            "--placements", "after", "--policies", "full", "--n-per-cell", "1", "--no-progress"]
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(models[0]), "--draft-model", str(short_draft),
                 "--keep", "0.25", "--chunk-size", "16", *grid, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "speculative: 1 sample(s) longer than the draft's context skipped" in captured.out
    assert "(passkey, 600) skipped: prompt has" in captured.out
    summary = json.loads((out / "summary.json").read_text())
    (skip,) = summary["config"]["speculative_skipped"]
    assert (skip["task"], skip["context_len"]) == ("passkey", 600)
    with (out / "results.csv").open(newline="") as file:
        records = list(csv.DictReader(file))
    assert sorted((r["policy"], r["context_len"]) for r in records) == [
        ("full", "300"), ("full", "600"), ("speculative", "300")]
    speculative.main(["report", str(out), "--out", str(tmp_path / "keep.png")])
    lines = capsys.readouterr().out.splitlines()
    (row,) = [line for line in lines if "| passkey | 600 |" in line]
    assert row.endswith("| — |  | 1 |  |")


def test_the_kept_tokens_of_one_prompt_are_drawn(models, tmp_path, capsys):
    png = tmp_path / "chunks.png"
    speculative.main(["chunks", "--target", str(models[0]), "--draft", str(models[1]),
                      "--task", "niah", "--length", "600", "--keeps", "0.25,1",
                      "--out", str(png)])
    quarter, everything, wrote = capsys.readouterr().out.splitlines()
    kept, total = (int(n) for n in quarter.split()[2].split("/"))
    assert quarter.startswith("keep 0.25: ") and kept < total / 2
    assert everything == f"keep 1: {total}/{total} target tokens, needle 100% kept"
    assert wrote == f"wrote {png}" and png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("placement", ["after", "before"])
def test_compact_compares_the_drafts_cut_with_truncations_past_the_targets_context(
        models, tmp_path, capsys, placement):
    """A prompt past the target's 1024 tokens (the draft reads 4096): one row per budget, each
    method's answer, the speculative cut within its budget plus the always-kept tail."""
    long_draft = write_tiny_model(tmp_path / "draft", seed=9, context=4096)
    speculative.main(["compact", "--target", str(models[0]), "--draft", str(long_draft),
                      "--length", "1500", "--budgets", "300,600", "--samples", "2",
                      "--tasks", "niah", "--placement", placement, "--max-new-tokens", "4"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| task | depth | prompt tokens | draft tokens | budget | last | "
                               "first+last | speculative | speculative kept |")
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    rows = [row for row in cells if row[0] == "niah"]
    assert [(row[1], row[4]) for row in rows] == [
        ("0.1", "300"), ("0.1", "600"), ("0.3", "300"), ("0.3", "600")]
    for row in rows:
        assert 1024 < int(row[2]) <= 1500
        tail = 60 if placement == "after" else 20  # the question and the cue / the cue
        assert int(row[4]) - 32 <= int(row[8]) <= int(row[4]) + tail
    totals = {row[4]: row[5:8] for row in cells if row[0] == "**right**"}
    assert sorted(totals) == ["300", "600"]
    for budget, counts in totals.items():
        for column, count in zip((5, 6, 7), counts, strict=True):
            answered = sum(row[column] == "yes" for row in rows if row[4] == budget)
            assert count == f"{answered}/2"


def _entry(correct: int, n: int) -> dict:
    return {"correct": correct, "n": n, "accuracy": correct / n}


@pytest.mark.parametrize(("full", "at_target", "expected"), [
    (_entry(4, 4), _entry(4, 4), "met"), (_entry(4, 4), _entry(3, 4), "missed"),
    (_entry(10, 10), _entry(9, 10), "met"), (_entry(2, 4), _entry(1, 4), "missed"),
    (_entry(2, 4), _entry(2, 4), "met"), (_entry(1, 4), _entry(0, 4), "n.a."),
    (_entry(4, 4), None, "n.a."),
])
def test_the_target_is_90_percent_of_full_where_full_answers_half(full, at_target, expected):
    assert verdict(full, at_target) == expected


@pytest.mark.parametrize(("flags", "message"), [
    (["--keep", "0"], "speculative.keep must be in (0, 1], got 0.0"),
    (["--keep", "0.25,1.5"], "speculative.keep must be in (0, 1], got 1.5"),
    (["--keep", "0.25,0.25"], "keep shares must be distinct"),
    (["--keep", "a"], "expected comma-separated shares in (0, 1]"),
    (["--chunk-size", "0"], "speculative.chunk_size must be >= 1"),
    (["--placements", "after,before"], "a draft model needs placements=after"),
])
def test_bad_speculative_flags_are_one_line_errors(models, tmp_path, capsys, flags, message):
    target, draft = models
    args = ["eval", "--model", str(target), "--draft-model", str(draft), *GRID, *flags,
            "--out", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())  # nothing written


def test_speculative_flags_need_a_draft(models, tmp_path, capsys):
    assert main(["eval", "--model", str(models[0]), "--keep", "0.25", "--positions", "compact",
                 *GRID, "--out", str(tmp_path)]) == 2
    assert "--keep, --positions need(s) --draft-model" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "target_default", "expected"), [
    (None, "compact", "compact"), (None, "original", "original"),
    ("original", "compact", "original"), ("compact", "original", "compact")])
def test_the_grids_positions_are_the_targets_default_unless_named(flag, target_default,
                                                                  expected):
    args = argparse.Namespace(model=None, draft_model="d", keep=None, positions=flag,
                              chunk_size=None, look_ahead=None)
    assert speculative_from_args(args, target_default).positions == expected


@pytest.mark.parametrize(("fields", "message"), [
    ({"keeps": ()}, "keep shares must be distinct and not empty"),
    ({"keeps": (0.1, -0.5)}, "speculative.keep"),
    ({"positions": "sideways"}, "speculative.positions"),
    ({"look_ahead": -1}, "speculative.look_ahead"),
])
def test_grid_validation_names_the_setting(fields, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        SpeculativeGrid(draft="d", **fields)


def test_a_grid_needs_the_question_after_the_context():
    grid = SpeculativeGrid(draft="d")
    assert EvalConfig(placements=(Placement.AFTER,), speculative=grid).speculative == grid
    with pytest.raises(ValueError, match="placements=after and gaps=0"):
        EvalConfig(placements=(Placement.AFTER,), gaps=(0, 64), speculative=grid)


@pytest.mark.parametrize(("positions", "pair"), [
    ("original", "draft → target"), ("compact", "draft → target, compact positions")])
def test_runs_of_two_position_modes_are_two_pairs(tmp_path, positions, pair):
    (tmp_path / "summary.json").write_text(json.dumps({"model": "/models/target", "config": {
        "speculative": {"draft": "draft", "keeps": [0.25], "positions": positions}}}))
    assert load_pair(tmp_path)["pair"] == pair
