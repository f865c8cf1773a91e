"""`snapstream ask`: a folder of source files and a question in one chat prompt that fits the
context (the files that do not fit are named), the answer the engine gives that prompt, what it
cost, speculative prefill that keeps the question, and one-line errors for bad paths."""

from __future__ import annotations

import json

import pytest

from cli.ask import find_files, question_block, read_sources, user_message
from cli.main import main
from snapstream.chat import ChatMessage
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.sampling_params import SamplingParams
from tests.tiny_models import write_tiny_model

QUESTION = "Which function adds up the prices?"
NEW_TOKENS = 4


def _source(i: int) -> str:
    body = "\n".join(f"    total_{j} = price_{j} * {i + j}" for j in range(30))
    return f"def function_{i}(prices):\n{body}\n    return total_0\n"


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    for i in range(12):
        path = root / f"pkg{i % 3}" / f"module_{i:02d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_source(i), encoding="utf-8")
    for hidden in (root / ".git" / "hook.py", root / "pkg0" / "__pycache__" / "m.py"):
        hidden.parent.mkdir(parents=True)
        hidden.write_text("x = 1\n", encoding="utf-8")
    (root / "pkg1" / "blob.py").write_bytes(b"\xff\xfe\x00binary")
    (root / "README.md").write_text("not python\n", encoding="utf-8")
    return root


def _ask(model_dir, *extra: str) -> list[str]:
    return ["ask", "--model", str(model_dir), "--question", QUESTION, "--max-new-tokens",
            str(NEW_TOKENS), "--temperature", "0", "--json", *extra]


def test_files_are_found_in_path_order_without_hidden_folders(project):
    files = find_files([project], "*.py")
    names = [str(p.relative_to(project)) for p in files]
    assert names == sorted(names) and len(names) == 13  # 12 modules and the binary
    assert not any(".git" in n or "__pycache__" in n for n in names)
    sources, not_text = read_sources(files)
    assert [p.name for p in not_text] == ["blob.py"] and len(sources) == 12


def test_the_prompt_holds_the_files_that_fit_and_names_the_rest(tiny_model_dir, project,
                                                                capsys):
    """The tiny model's 2,048-token context holds some of the twelve files: those are read
    whole, in order, and one more would not have fit."""
    assert main(_ask(tiny_model_dir, str(project), "--policy", "full")) == 0
    got = json.loads(capsys.readouterr().out)
    engine = Engine.from_pretrained(tiny_model_dir)
    sources, _ = read_sources(find_files([project], "*.py"))
    assert got["files"] + got["left_out"] == [str(s.path) for s in sources]
    assert got["files"] and got["left_out"] and got["not_text"][0].endswith("blob.py")

    def prompt(count: int) -> list[int]:
        text = user_message(sources[:count], QUESTION)
        return engine.tokenizer.encode(engine.tokenizer.render_chat([ChatMessage("user", text)]))

    kept = len(got["files"])
    limit = engine.context_len - NEW_TOKENS
    assert len(prompt(kept)) == got["prompt_tokens"] <= limit < len(prompt(kept + 1))
    expected = engine.generate(prompt(kept), NEW_TOKENS, policy=CachePolicy(kind="full"),
                               sampling=SamplingParams(temperature=0.0))
    assert got["answer"] == expected.text and got["new_tokens"] == len(expected.token_ids)
    assert got["ttft_s"] > 0 and got["policy"] == "full"
    assert got["kv_bytes"] >= got["full_kv_bytes_f16"] // 2  # full: every token, >= 8 bits


def test_a_fixed_size_policy_holds_less_than_the_full_cache(tiny_model_dir, project, capsys):
    assert main(_ask(tiny_model_dir, str(project), "--policy", "snapstream", "--n-sink", "4",
                     "--n-topk", "124", "--n-recent", "128")) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["policy"] == "snapstream" and got["prompt_tokens"] > 1024
    # 256 of the prompt's > 1,024 slots, in float32: under half the float16 full cache
    assert got["kv_bytes"] < got["full_kv_bytes_f16"] / 2


def test_speculative_prefill_keeps_the_question(tiny_model_dir, project, tmp_path, capsys):
    draft_dir = write_tiny_model(tmp_path / "draft", seed=9)
    assert main(_ask(tiny_model_dir, str(project / "pkg0"), "--draft-model", str(draft_dir),
                     "--keep", "0.25", "--chunk-size", "16", "--policy", "full")) == 0
    got = json.loads(capsys.readouterr().out)
    spec = got["speculative"]
    assert spec["draft_model"] == str(draft_dir) and not spec["skipped"]
    assert spec["kept_tokens"] < spec["prompt_tokens"] == got["prompt_tokens"]
    engine = Engine.from_pretrained(tiny_model_dir)
    question = engine.tokenizer.encode(question_block(QUESTION))
    assert spec["kept_tokens"] >= len(question)  # the question is kept whole, at least


@pytest.mark.parametrize(("paths", "extra", "message"), [
    (["/nonexistent/folder"], [], "no such file or folder"),
    (["{project}"], ["--glob", "*.rs"], "change --glob"),
    (["{project}"], ["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
])
def test_bad_paths_and_flags_give_one_line(tiny_model_dir, project, capsys, paths, extra,
                                           message):
    args = ["ask", "--model", str(tiny_model_dir), "--question", QUESTION, *extra,
            *(p.format(project=project) for p in paths)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
