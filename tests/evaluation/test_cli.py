"""`snapstream eval` end to end on a tiny random checkpoint, through the real CLI registry."""

import contextlib
import csv
import io
import json
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest

from cli.main import main
from evaluation.budget import Budget
from evaluation.results import COLUMNS
from tests.tiny_models import random_model, tiny_config, write_hf_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--tasks", "passkey,niah", "--context-lens", "600", "--depths", "0.2,0.8",
        "--policies", "full,snapstream", "--budgets", "1/2,1/4,300", "--n-per-cell", "2",
        "--max-group-tokens", "1500", "--no-progress"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    config = tiny_config(max_position_embeddings=1024)
    return write_hf_dir(tmp_path_factory.mktemp("tiny"), random_model(config))


@pytest.fixture(scope="module")
def result(checkpoint, tmp_path_factory) -> tuple[Path, str]:
    out, stdout = tmp_path_factory.mktemp("eval"), io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["eval", "--model", str(checkpoint), *TINY, "--out", str(out)]) == 0
    return out, stdout.getvalue()


def test_results_csv_has_a_row_per_sample_and_run(result):
    out, _ = result
    with (out / "results.csv").open(newline="") as file:
        records = list(csv.DictReader(file))
    assert tuple(records[0]) == COLUMNS
    # (2 tasks x 2 placements x 2 samples) x (full + snapstream x 3 budgets)
    assert len(records) == 8 * 4
    runs = {(r["policy"], r["budget_label"], r["budget"]) for r in records}
    assert runs == {("full", "", ""), ("snapstream", "1/2", "300"), ("snapstream", "1/4", "150"),
                    ("snapstream", "300", "300")}
    assert {r["placement"] for r in records} == {"after", "before"}
    assert {r["depth"] for r in records} == {"0.2", "0.8"}
    for record in records:
        assert record["task"] in ("passkey", "niah") and record["context_len"] == "600"
        assert record["correct"] in ("True", "False") and record["gap"] == "0"
        # the sample less its answer cue (up to ~70 tokens of the tiny byte-level tokenizer)
        assert 600 - 16 - 80 <= int(record["prompt_tokens"]) < 600
        assert 1 <= int(record["new_tokens"]) <= 20
    # equal policies (1/2 of 600 and 300 tokens) are decoded once and agree
    by_label = {(r["sample"], r["budget_label"]): r["generated"] for r in records}
    assert all(by_label[(s, "1/2")] == by_label[(s, "300")] for s, _ in by_label)


def test_summary_json_is_well_formed(result):
    out, _ = result
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_rows"] == 32
    assert summary["config"]["budgets"] == ["1/2", "1/4", "300"]
    assert summary["config"]["prompt_format"] == "chat"
    assert len(summary["overall"]) == 2 * 4  # placements x runs
    for entry in summary["by_task"]:
        assert entry["n"] == 2 and 0.0 <= entry["accuracy"] <= 1.0
        assert entry["budget_fraction"] in (None, 0.5, 0.25)
        assert set(entry) >= {"task", "placement", "gap", "policy", "budget_label",
                              "full_accuracy", "relative_to_full", "correct"}


def test_pngs_are_written(result):
    out, _ = result
    for name in ("accuracy_vs_budget.png", "heatmap_full.png", "heatmap_snapstream.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000, name


def test_prints_summary_table(result):
    _, printed = result
    assert "| policy | budget | passkey | niah | all |" in printed
    assert "| snapstream | 1/4 |" in printed


@pytest.mark.parametrize(("flag", "value", "names"), [
    ("--budgets", "1/4,abc", "--budgets"),
    ("--context-lens", "512,x", "--context-lens"),
    ("--policies", "full,h2o", "policies"),
    ("--placements", "middle", "placements"),
    ("--n-per-cell", "0", "n_per_cell"),
    ("--recent-fraction", "2", "recent_fraction"),
    ("--prompt-format", "xml", "--prompt-format"),
    ("--gaps", "0,x", "--gaps"),
    ("--pooling", "median", "--pooling"),
])
def test_bad_flag_exits_2_with_one_line(capsys, tmp_path, flag, value, names):
    assert main(["eval", flag, value, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and names in err
    assert not any(tmp_path.iterdir())


def test_gaps_follow_the_question_as_if_generated(checkpoint):
    from evaluation.config import EvalConfig
    from evaluation.runner import model_inputs
    from snapstream.engine import Engine

    engine = Engine.from_pretrained(checkpoint)
    cfg = EvalConfig(tasks=("niah",), context_lens=(600,), placements=("after",),
                     gaps=(0, 100))
    sample = cfg.samples(engine.tokenizer)[0]
    ids, forced = model_inputs(engine, cfg, 100, 0, sample)
    assert engine.tokenizer.decode(ids).endswith(f"{sample.question}\nassistant\n")
    assert len(forced) == 100 + len(engine.tokenizer.encode(f"\n\n{sample.cue}"))
    assert engine.tokenizer.decode(forced).endswith(f"\n\n{sample.cue}")
    assert model_inputs(engine, cfg, 100, 0, sample) == (ids, forced)  # drawn from the seed
    # without a gap the cue follows at once, still decoded rather than compressed
    same_ids, cue = model_inputs(engine, cfg, 0, 0, sample)
    assert same_ids == ids and engine.tokenizer.decode(cue) == sample.cue


def test_the_compressed_prompt_stops_before_the_answer_cue_in_every_format(checkpoint):
    from evaluation.config import EvalConfig
    from evaluation.runner import model_inputs
    from snapstream.engine import Engine

    engine = Engine.from_pretrained(checkpoint)
    for fmt in ("chat", "raw"):
        cfg = EvalConfig(tasks=("niah",), context_lens=(600,), prompt_format=fmt)
        for index, sample in enumerate(cfg.samples(engine.tokenizer)):
            ids, cue = model_inputs(engine, cfg, 0, index, sample)
            prompt, answer = engine.tokenizer.decode(ids), engine.tokenizer.decode(cue)
            assert sample.cue not in prompt[-len(sample.cue) - 8:]
            assert answer.strip() == sample.cue and (prompt + answer).endswith(sample.cue)


def test_gaps_share_one_forward_and_match_each_gap_alone(checkpoint, monkeypatch):
    from evaluation import runner
    from evaluation.config import EvalConfig
    from snapstream.engine import Engine

    engine = Engine.from_pretrained(checkpoint)
    cfg = EvalConfig(tasks=("niah",), context_lens=(600,), placements=("after",),
                     policies=("full", "snapstream"), budgets=(Budget.parse("1/4"),),
                     n_per_cell=2, gaps=(0, 30, 60))
    samples = cfg.samples(engine.tokenizer)
    calls = []
    run = runner.PromptForward.run
    monkeypatch.setattr(runner.PromptForward, "run",
                        lambda *args: calls.append(1) or run(*args))
    together = runner.evaluate(engine, cfg, samples, progress=False)
    assert len(calls) == 2  # a forward per sample, shared by every gap
    for gap in cfg.gaps:
        alone = runner.evaluate(engine, replace(cfg, gaps=(gap,)), samples, progress=False)
        assert [row for row in together if row.gap == gap] == alone


class _Bar:
    """tqdm's part the runner uses, recording what it is told."""

    made: ClassVar[list] = []

    def __init__(self, total: int, **_):
        self.total, self.updates = total, []
        _Bar.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    def update(self, n: int) -> None:
        self.updates.append(n)


def test_progress_counts_forwards_and_forced_decodes_to_its_total(checkpoint, monkeypatch):
    from evaluation import runner
    from evaluation.config import EvalConfig
    from snapstream.engine import Engine

    engine = Engine.from_pretrained(checkpoint)
    cfg = EvalConfig(tasks=("niah",), context_lens=(600,), placements=("after",),
                     policies=("full", "snapstream"), budgets=(Budget.parse("1/4"),),
                     n_per_cell=2, gaps=(0, 200))
    samples = cfg.samples(engine.tokenizer)
    monkeypatch.setattr(runner, "tqdm", _Bar)
    _Bar.made.clear()
    forwards: dict = {}
    runner.evaluate(engine, cfg, samples, forwards=forwards)
    bar = _Bar.made[-1]
    assert sum(bar.updates) == bar.total
    # the last steps are the gap's decodes (200 forced tokens a row, 2 rows, 2 policies), not
    # the forwards: the bar reaches its end when the work does
    assert bar.updates[-1] >= 2 * 200 and bar.updates[-2] >= 2 * 200
    runner.evaluate(engine, cfg, samples, forwards=forwards)  # every prompt cached
    again = _Bar.made[-1]
    assert sum(again.updates) == again.total < bar.total


def test_eval_with_gaps_writes_its_results(checkpoint, tmp_path):
    flags = [*TINY, "--placements", "after", "--gaps", "0,40"]
    assert main(["eval", "--model", str(checkpoint), *flags, "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["gaps"] == [0, 40]
    with (tmp_path / "results.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 2 * 2 * 2 * 4  # gaps x tasks x samples x runs
    assert (tmp_path / "accuracy_vs_gap.png").read_bytes().startswith(PNG_MAGIC)


def test_missing_model_exits_2(capsys, tmp_path):
    argv = ["eval", "--model", str(tmp_path / "nope"), *TINY, "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_base_model_is_asked_for_a_completion(tmp_path):
    """No chat template (a base model, as Gemma 3 270M): raw unless --prompt-format says."""
    config = tiny_config(max_position_embeddings=1024)
    base = write_hf_dir(tmp_path / "base", random_model(config), chat_template=None)
    flags = ["--tasks", "niah", "--context-lens", "600", "--placements", "after",
             "--policies", "full", "--n-per-cell", "1", "--max-group-tokens", "1500",
             "--no-progress"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["eval", "--model", str(base), *flags, "--out", str(tmp_path / "a")]) == 0
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["config"]["prompt_format"] == "raw"
    assert main(["eval", "--model", str(base), *flags, "--prompt-format", "chat",
                 "--out", str(tmp_path / "b")]) == 2  # asked for a template it has not


def test_workloads_on_real_text_run_in_cells_and_resume(checkpoint, tmp_path):
    args = ["eval", "--model", str(checkpoint), "--tasks", "codesearch,paraphrase,multineedle",
            "--context-lens", "600", "--policies", "full,snapstream,streaming", "--budgets",
            "1/4", "--n-per-cell", "1", "--max-group-tokens", "1500", "--no-progress",
            "--out", str(tmp_path)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(args) == 0
    with (tmp_path / "results.csv").open(newline="") as file:
        records = list(csv.DictReader(file))
    assert len(records) == 3 * 2 * 3  # tasks x placements x runs
    assert {r["task"] for r in records} == {"codesearch", "paraphrase", "multineedle"}
    for record in records:
        kept, attention = float(record["answer_kept"]), float(record["needle_attention"])
        assert 0.0 <= kept <= 1.0 and 0.0 <= attention <= 1.0
        assert record["policy"] != "full" or float(record["needle_kept"]) == 1.0
    cells = sorted(path.name for path in (tmp_path / "cells").iterdir())
    assert len(cells) == 3 * 2 + 1 and "codesearch-600-before.json" in cells
    report = (tmp_path / "report.md").read_text()
    assert "accuracy [95% interval] (samples)" in report and "why answers were lost" in report
    first = (tmp_path / "results.csv").read_bytes()
    again = io.StringIO()
    with contextlib.redirect_stdout(again):
        assert main(args) == 0
    assert again.getvalue().count("cell ") == 6 and "read 3 rows" in again.getvalue()
    assert (tmp_path / "results.csv").read_bytes() == first


def test_eval_keeping_words_writes_rows_of_that_unit(checkpoint, tmp_path):
    """The runs keep whole words; the rows' analysis still reads the tokens' own votes."""
    flags = [*TINY, "--placements", "after", "--unit", "word"]
    assert main(["eval", "--model", str(checkpoint), *flags, "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["unit"] == "word"
    with (tmp_path / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 4 and {row["unit"] for row in rows} == {"word"}
    assert all(row["answer_kept"] for row in rows if row["policy"] == "snapstream")
