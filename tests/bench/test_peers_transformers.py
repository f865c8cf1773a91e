"""The transformers runner on tiny random models, through the runner protocol, with this
project's python and transformers standing in for the kvpress venv's: a Llama GGUF through the
cached Hugging Face export, and a Gemma 3 directory (sliding-window layers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.peers import recipes
from bench.peers.models import hf_model_dir
from bench.peers.process import RunnerError, RunnerProcess
from bench.peers.runners import RUNNERS
from bench.peers.venvs import COMPLETE_MARKER, Venv
from tests.tiny_models import (
    random_model,
    tiny_config,
    tiny_gemma3_config,
    write_gguf,
    write_hf_dir,
)

PROMPT_LEN = 1500  # > the runner's 4096 prefill tokens per step over 3 rows: two chunks
THIS_PYTHON = Venv(recipes.KVPRESS, Path(sys.executable).parent.parent)


def _started(model_dir: Path, log: Path):
    process = RunnerProcess(sys.executable, RUNNERS / "run_hf.py", log)
    process.call("load", model=str(model_dir), n_threads=1, n_ctx=4096, options={})
    return process


@pytest.fixture(scope="module")
def llama_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("peers")
    gguf = write_gguf(root / "tiny.gguf",
                      random_model(tiny_config(max_position_embeddings=4096)), {})
    return root, gguf, hf_model_dir(THIS_PYTHON, gguf, echo=lambda _: None, root=root)


@pytest.fixture(scope="module", params=["llama-gguf", "gemma3"])
def runner(request, llama_export, tmp_path_factory):
    directory = tmp_path_factory.mktemp("model")
    if request.param == "gemma3":
        model_dir = write_hf_dir(directory, random_model(tiny_gemma3_config()))
    else:
        model_dir = llama_export[2]
    with _started(model_dir, directory / "transformers.log") as process:
        yield request.param, process


def _prompt(offset: int) -> list[int]:
    return [3 + (offset + 7 * i) % 200 for i in range(PROMPT_LEN)]


def test_the_export_is_made_once_and_reused(llama_export):
    root, gguf, model_dir = llama_export
    assert (model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file()
    assert (model_dir.parent / COMPLETE_MARKER).is_file()
    made = (model_dir / "model.safetensors").stat().st_mtime_ns
    again = hf_model_dir(THIS_PYTHON, gguf, echo=pytest.fail, root=root)  # no export: no echo
    assert again == model_dir and (again / "model.safetensors").stat().st_mtime_ns == made


def test_a_batch_gives_each_row_what_it_gets_alone(runner):
    _, runner = runner
    prompts = [_prompt(offset) for offset in (0, 1, 2)]
    batch = runner.call("generate_batch", prompts=prompts, max_new_tokens=5, options={})
    alone = [runner.call("generate", prompt_ids=ids, max_new_tokens=5, options={})
             for ids in prompts]
    assert batch["token_ids"] == [reply["token_ids"] for reply in alone]
    assert all(len(row) == 5 and row == sorted(row) for row in batch["stamps_s"])
    assert batch["kv_bytes"] == alone[0]["kv_bytes"]  # per row: the same cache as alone
    assert alone[0]["extra"]["cached_tokens"] == PROMPT_LEN + 4


def test_sliding_window_layers_keep_only_their_window(runner):
    kind, runner = runner
    long = runner.call("generate", prompt_ids=_prompt(0), max_new_tokens=2, options={})
    short = runner.call("generate", prompt_ids=_prompt(0)[:300], max_new_tokens=2, options={})
    growth = long["kv_bytes"] / short["kv_bytes"]
    cached = (PROMPT_LEN + 1) / (300 + 1)
    if kind == "gemma3":  # the global layer grows with the prompt, the sliding ones stop
        assert 1 < growth < cached
    else:  # every layer global
        assert growth == pytest.approx(cached)


def test_a_batch_of_unequal_prompts_is_refused(runner):
    _, runner = runner
    with pytest.raises(RunnerError, match="prompts of one length"):
        runner.call("generate_batch", prompts=[_prompt(0), _prompt(0)[:-1]],
                    max_new_tokens=5, options={})
