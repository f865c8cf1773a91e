"""`snapstream eval` end to end on a tiny random checkpoint, through the real CLI registry."""

import contextlib
import csv
import io
import json
from pathlib import Path

import pytest

from snapstream.cli import main
from snapstream.evaluate.results import COLUMNS
from tests.tiny_models import random_model, tiny_config, write_hf_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--tasks", "passkey", "--context-lens", "256", "--depths", "0,1",
        "--policies", "full,snapstream", "--budgets", "1/2,1/4", "--n-per-cell", "1",
        "--max-new-tokens", "8", "--no-progress"]


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
    assert len(records) == 4 * 3  # (2 depths x 2 placements) x (full + snapstream x 2 budgets)
    runs = [(r["policy"], r["budget_label"], r["budget"]) for r in records[:3]]
    assert runs == [("full", "", ""), ("snapstream", "1/2", "128"), ("snapstream", "1/4", "64")]
    assert {r["placement"] for r in records} == {"after", "before"}
    assert {r["depth"] for r in records} == {"0.0", "1.0"}
    for record in records:
        assert record["task"] == "passkey" and record["context_len"] == "256"
        assert record["correct"] in ("True", "False")
        assert 200 <= int(record["prompt_tokens"]) <= 256  # 256 bytes, a few pairs merged
        assert float(record["latency_s"]) > 0


def test_summary_json_is_well_formed(result):
    out, _ = result
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_rows"] == 12
    assert summary["config"]["budgets"] == ["1/2", "1/4"]
    assert len(summary["overall"]) == 2 * 3  # placements x runs
    assert len(summary["by_task_length"]) == 2 * 3
    for entry in summary["by_task"]:
        assert entry["n"] == 2 and 0.0 <= entry["accuracy"] <= 1.0
        assert entry["budget_fraction"] in (None, 0.5, 0.25)
        assert set(entry) >= {"task", "placement", "policy", "budget_label", "full_accuracy",
                              "relative_to_full", "correct", "mean_latency_s"}


def test_pngs_are_written(result):
    out, _ = result
    for name in ("accuracy_vs_budget.png", "heatmap_full.png", "heatmap_snapstream.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000, name


def test_prints_summary_table(result):
    _, printed = result
    assert "| policy | budget | passkey | all |" in printed
    assert "| snapstream | 1/4 |" in printed


@pytest.mark.parametrize(("flag", "value", "names"), [
    ("--budgets", "1/4,abc", "--budgets"),
    ("--context-lens", "512,x", "--context-lens"),
    ("--policies", "full,h2o", "policies"),
    ("--placements", "middle", "placements"),
    ("--n-per-cell", "0", "n_per_cell"),
    ("--recent-fraction", "2", "recent_fraction"),
    ("--pooling", "median", "--pooling"),
])
def test_bad_flag_exits_2_with_one_line(capsys, tmp_path, flag, value, names):
    assert main(["eval", flag, value, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and names in err
    assert not any(tmp_path.iterdir())


def test_gap_tokens_follow_the_question_as_if_generated(checkpoint):
    from snapstream.data import ANSWER_CUE
    from snapstream.evaluate.config import EvalConfig
    from snapstream.evaluate.runner import model_inputs
    from snapstream.evaluate.shared_prefill import SharedPrefillEngine

    engine = SharedPrefillEngine.from_pretrained(checkpoint)
    cfg = EvalConfig(tasks=("passkey",), context_lens=(256,), depths=(0.5,),
                     placements=("after",), gap_tokens=100)
    sample = cfg.samples()[0]
    ids, forced = model_inputs(engine, cfg, 0, sample)
    assert engine.tokenizer.decode(ids).endswith(sample.question)
    gap = engine.tokenizer.decode(forced)
    assert gap.endswith(ANSWER_CUE) and 100 - 16 <= len(gap) - len(ANSWER_CUE) - 1 <= 100
    assert model_inputs(engine, cfg, 0, sample) == (ids, forced)  # drawn from the seed
    plain = model_inputs(engine, EvalConfig(placements=("after",)), 0, sample)
    assert plain == (engine.encode(sample.prompt), [])


def test_eval_with_a_gap_writes_its_results(checkpoint, tmp_path):
    flags = [*TINY, "--placements", "after", "--gap-tokens", "40"]
    assert main(["eval", "--model", str(checkpoint), *flags, "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["gap_tokens"] == 40
    with (tmp_path / "results.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 2 * 3  # 2 depths x (full + 2 budgets)


def test_missing_model_exits_2(capsys, tmp_path):
    argv = ["eval", "--model", str(tmp_path / "nope"), *TINY, "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert "does not exist" in capsys.readouterr().err
