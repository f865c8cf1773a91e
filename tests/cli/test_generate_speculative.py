"""`snapstream generate --draft-model`: the draft's selection, the target's answer, the report;
flags that need a draft without one; a prompt from a file."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from snapstream.checkpoints.registry import MODELS
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.sampling_params import SamplingParams
from snapstream.specprefill.pieces import Request, render_served
from snapstream.specprefill.selector import DraftSelector
from snapstream.specprefill.settings import SpeculativeSettings
from tests.tiny_models import (
    random_model,
    tiny_gemma3_config,
    write_hf_dir,
    write_tiny_model,
)

DOCUMENT = " ".join(f"Item {i} costs {i * 37 % 1000} coins." for i in range(40))


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("draft"), seed=9)


@pytest.mark.parametrize("positions", ["original", "compact"])
def test_generate_prefills_the_drafts_pick(tiny_model_dir, draft_dir, tmp_path, capsys,
                                           positions):
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(DOCUMENT, encoding="utf-8")
    args = ["generate", "--model", str(tiny_model_dir), "--draft-model", str(draft_dir),
            "--keep", "0.25", "--chunk-size", "16", "--positions", positions,
            "--prompt-file", str(prompt_file), "--max-new-tokens", "8", "--temperature", "0",
            "--policy", "full", "--json"]
    assert main(args) == 0
    got = json.loads(capsys.readouterr().out)
    target = Engine.from_pretrained(tiny_model_dir)
    request = Request.completion(DOCUMENT)  # the draft reads it through its chat template
    selection = DraftSelector(Engine.from_pretrained(draft_dir)).select(
        request, render_served(target.tokenizer, request), target.tokenizer,
        SpeculativeSettings(keep=0.25, chunk_size=16, positions=positions))
    expected = target.generate(selection.ids, 8, policy=CachePolicy(kind="full"),
                               sampling=SamplingParams(temperature=0.0),
                               positions=selection.positions)
    assert got["token_ids"] == expected.token_ids
    report = got["speculative"]
    assert report["kept_tokens"] == len(selection.ids) < report["prompt_tokens"]
    assert report["skipped"] == "" and report["draft_time_s"] > 0
    assert report["positions"] == positions


@pytest.mark.parametrize(("flags", "expected"), [([], "compact"),
                                                 (["--positions", "original"], "original")])
def test_a_sliding_window_target_renumbers_unless_told(draft_dir, tmp_path, capsys, flags,
                                                       expected):
    target_dir = write_hf_dir(tmp_path / "gemma", random_model(tiny_gemma3_config(), seed=4))
    args = ["generate", "--model", str(target_dir), "--draft-model", str(draft_dir),
            "--keep", "0.25", "--chunk-size", "16", *flags, "--prompt", DOCUMENT,
            "--max-new-tokens", "4", "--policy", "full", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["speculative"]["positions"] == expected


def test_a_target_without_sliding_window_layers_keeps_positions_by_default(
        tiny_model_dir, draft_dir, capsys):
    args = ["generate", "--model", str(tiny_model_dir), "--draft-model", str(draft_dir),
            "--keep", "0.25", "--chunk-size", "16", "--prompt", DOCUMENT,
            "--max-new-tokens", "4", "--policy", "full", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["speculative"]["positions"] == "original"


@pytest.mark.parametrize(("extra", "message"), [
    (["--keep", "0.5"], "--keep need(s) --draft-model"),
    (["--draft-model", "X", "--prompt-ids", "1,2"], "the draft reads text"),
    (["--prompt-file", "/nonexistent/prompt.txt"], "--prompt-file: cannot read"),
])
def test_bad_generate_flags_give_one_line(tiny_model_dir, capsys, extra, message):
    args = ["generate", "--model", str(tiny_model_dir), *extra]
    if "--prompt-ids" not in extra and "--prompt-file" not in extra:
        args += ["--prompt", "hi"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_keep_share_out_of_range_is_refused(tiny_model_dir, draft_dir, capsys):
    args = ["generate", "--model", str(tiny_model_dir), "--draft-model", str(draft_dir),
            "--keep", "1.5", "--prompt", DOCUMENT]
    assert main(args) == 2
    assert "speculative.keep must be in (0, 1]" in capsys.readouterr().err


def test_auto_drafts_with_the_targets_default_draft(capsys):
    args = ["generate", "--model", "smollm2-135m", "--draft-model", "auto", "--keep", "0.25",
            "--chunk-size", "32", "--prompt", DOCUMENT, "--max-new-tokens", "2",
            "--temperature", "0", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)["speculative"]
    assert report["draft_model"] == MODELS["smollm2-135m"].draft == "gemma3-270m"
    assert report["kept_tokens"] < report["prompt_tokens"] and not report["skipped"]


def test_auto_needs_a_registry_target(tiny_model_dir, capsys):
    args = ["generate", "--model", str(tiny_model_dir), "--draft-model", "auto", "--prompt",
            DOCUMENT]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "name the draft" in err and err.count("\n") == 1
