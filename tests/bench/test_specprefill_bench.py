"""`snapstream bench specprefill` on tiny random checkpoints: the measured table, the SN40L
projection, the doc section with the exact command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from snapstream.cpu import matmul_dtype_name
from tests.tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    return (write_tiny_model(tmp_path_factory.mktemp("target"), context=1024),
            write_tiny_model(tmp_path_factory.mktemp("draft"), seed=9, context=1024))


@pytest.fixture(scope="module")
def run(models, tmp_path_factory) -> tuple[dict, str]:
    target, draft = models
    out = tmp_path_factory.mktemp("bench")
    doc = out / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nkept text\n")
    assert main(["bench", "specprefill", "--target", str(target), "--draft", str(draft),
                 "--lengths", "400,800", "--keep", "0.25", "--sim-lengths", "8192",
                 "--sim-keeps", "0.1,0.5", "--doc", str(doc),
                 "--json-out", str(out / "r.json"), "--plot", str(out / "img" / "ttft.png")]) == 0
    assert (out / "img" / "ttft.png").stat().st_size > 0
    return json.loads((out / "r.json").read_text()), doc.read_text()


def test_each_length_times_the_target_alone_the_draft_and_the_kept_prefill(run):
    results, _ = run
    measured = results["measured"]
    # passkey prompts of about each length (their answer cue and a few tokens short)
    assert [360 <= r["prompt_tokens"] <= 400 for r in measured] == [True, False]
    assert 760 <= measured[1]["prompt_tokens"] <= 800
    for row in measured:
        # the ranked chunks that fit a quarter (whole chunks), the first and the last
        assert 0.1 * row["prompt_tokens"] < row["kept_tokens"] < 0.4 * row["prompt_tokens"]
        assert row["full_s"] > 0 and row["draft_s"] > 0 and row["kept_s"] > 0


def test_the_projection_covers_every_length_and_keep_share(run):
    projected = run[0]["projected"]
    assert [(r["prompt_len"], r["keep"]) for r in projected] == [(8192, 0.1), (8192, 0.5)]
    assert projected[0]["target_kept_s"] < projected[1]["target_kept_s"]
    assert projected[0]["kept_tokens"] == 819


def test_the_doc_section_names_the_command_and_keeps_the_rest(run, models):
    _, doc = run
    assert doc.startswith("# Benchmarks\n\nkept text\n")
    name = f"specprefill-{models[1].name}-{models[0].name}"
    section = doc.split(f"<!-- bench:{name} -->")[1].split(f"<!-- /bench:{name} -->")[0]
    assert "Command: `snapstream " in section  # the process's own arguments follow
    assert (f"## Speculative prefill: time to first token, {models[1].name} drafting for "
            f"{models[0].name}") in section
    assert "| prompt tokens | kept tokens | target alone s |" in section
    assert "llama-3.2-1b drafting for llama-3.1-70b" in section
    assert section.count("\n| 8192 | ") == 2
    assert "![time to first token against prompt tokens](img/ttft.png)" in section


@pytest.mark.parametrize(("flags", "message"), [
    (["--keep", "0"], "keep shares must be in (0, 1]"),
    (["--sim-keeps", "0.1,2"], "keep shares must be in (0, 1]"),
    (["--rounds", "0"], "rounds must be >= 1"),
])
def test_bad_settings_are_one_line_errors(models, tmp_path, capsys, flags, message):
    doc = tmp_path / "benchmarks.md"
    assert main(["bench", "specprefill", "--target", str(models[0]), "--draft",
                 str(models[1]), *flags, "--doc", str(doc)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not doc.exists()


def test_the_draft_dtype_ab_prints_a_row_of_both_timings(tmp_path, capsys):
    """A tiny int8 draft: its bfloat16 prompt forward against float32, one table row."""
    from bench.specprefill_draft_dtype import main as draft_dtype_main

    draft = write_tiny_model(tmp_path / "draft", context=1024)
    draft_dtype_main(["--draft", str(draft), "--dtype", "int8", "--length", "600",
                      "--rounds", "1"])
    header, _, row = capsys.readouterr().out.splitlines()
    assert header.startswith("| draft | prefill dtype | prompt tokens | float32 s |")
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:2] == [str(draft), matmul_dtype_name()]  # the engine's prompt dtype
    assert 500 < int(cells[2]) <= 600 and float(cells[3]) > 0 and float(cells[4]) > 0
    assert int(cells[6].rstrip("%")) >= 75  # the chunks kept at 25% barely move
