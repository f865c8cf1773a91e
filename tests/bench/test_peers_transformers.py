"""The transformers runner on a tiny random GGUF, through the runner protocol, with this
project's transformers (the peers run it in the kvpress venv)."""

from __future__ import annotations

import sys

import pytest

from bench.peers.process import RunnerError, RunnerProcess
from bench.peers.runners import RUNNERS
from tests.tiny_models import random_model, tiny_config, write_gguf

PROMPT_LEN = 1500  # > the runner's 4096 prefill tokens per step over 3 rows: two chunks


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny")
    path = write_gguf(directory / "tiny.gguf",
                      random_model(tiny_config(max_position_embeddings=4096)), {})
    log = tmp_path_factory.mktemp("runner") / "transformers.log"
    with RunnerProcess(sys.executable, RUNNERS / "run_hf.py", log) as process:
        process.call("load", model=str(path), n_threads=1, n_ctx=4096, options={})
        yield process


def _prompt(offset: int) -> list[int]:
    return [3 + (offset + 7 * i) % 200 for i in range(PROMPT_LEN)]


def test_a_batch_gives_each_row_what_it_gets_alone(runner):
    prompts = [_prompt(offset) for offset in (0, 1, 2)]
    batch = runner.call("generate_batch", prompts=prompts, max_new_tokens=5, options={})
    alone = [runner.call("generate", prompt_ids=ids, max_new_tokens=5, options={})
             for ids in prompts]
    assert batch["token_ids"] == [reply["token_ids"] for reply in alone]
    assert all(len(row) == 5 and row == sorted(row) for row in batch["stamps_s"])
    assert batch["kv_bytes"] == alone[0]["kv_bytes"]  # per row: the same cache as alone
    assert alone[0]["extra"]["cached_tokens"] == PROMPT_LEN + 4


def test_a_batch_of_unequal_prompts_is_refused(runner):
    with pytest.raises(RunnerError, match="prompts of one length"):
        runner.call("generate_batch", prompts=[_prompt(0), _prompt(0)[:-1]],
                    max_new_tokens=5, options={})
