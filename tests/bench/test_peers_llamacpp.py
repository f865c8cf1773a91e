"""llama.cpp's runner and its OpenAI-compatible server, on the real model. Needs the llamacpp
venv already built by ``snapstream bench peers`` (the tests never build one)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from bench.peers import recipes
from bench.peers.peer_model import peer_model
from bench.peers.process import RunnerProcess
from bench.peers.runners import RUNNERS
from bench.peers.systems import get_system
from bench.peers.venvs import find_venv
from snapstream.checkpoints.registry import model_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llama_runner(tmp_path_factory):
    venv = find_venv(recipes.LLAMACPP)
    if venv is None:
        pytest.skip("the llamacpp venv is not built (snapstream bench peers builds it)")
    system = get_system("llama.cpp")
    log = tmp_path_factory.mktemp("llama") / "runner.log"
    with RunnerProcess(venv.python, RUNNERS / system.runner, log,
                       env=system.runner_env(venv)) as runner:
        runner.call("load", model=str(model_path()), n_threads=2, n_ctx=1024, options={})
        yield runner


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_generate_is_greedy_and_reports_the_kv_reservation(llama_runner):
    ids = list(range(1000, 1200))
    first = llama_runner.call("generate", prompt_ids=ids, max_new_tokens=6)
    again = llama_runner.call("generate", prompt_ids=ids, max_new_tokens=6)
    assert len(first["token_ids"]) == 6 and first["token_ids"] == again["token_ids"]
    # 30 layers × 3 KV heads × 64 dims, K and V, f16, for n_ctx = 1024
    assert first["kv_bytes"] == 2 * 30 * 1024 * 3 * 64 * 2
    assert first["ttft_ms"] > 0 and first["decode_ms_per_token"] > 0


def test_serve_starts_llama_server_with_parallel_slots(llama_runner):
    server = llama_runner.call("serve", n_parallel=2, n_ctx_per_slot=512)
    assert "--parallel" in server["argv"]
    slots = json.loads(urllib.request.urlopen(f"{server['base_url']}/slots", timeout=10).read())
    assert len(slots) == 2
    ids = list(range(1000, 1100))
    reply = _post(f"{server['openai_base_url']}/completions",
                  {"prompt": ids, "max_tokens": 4, "temperature": 0})
    assert reply["choices"][0]["text"]


def test_batch_runs_every_prompt_on_its_own_slot_at_once(llama_runner):
    prompts = [list(range(1000 + i, 1150 + i)) for i in range(3)]
    batch = llama_runner.call("generate_batch", prompts=prompts, max_new_tokens=5)
    single = llama_runner.call("generate", prompt_ids=prompts[1], max_new_tokens=5)
    assert [len(ids) for ids in batch["token_ids"]] == [5, 5, 5]
    assert batch["token_ids"][1] == single["token_ids"]  # greedy, the same on a slot
    assert "--parallel" in batch["extra"]["argv"] and "3" in batch["extra"]["argv"]
    # one slot: prompt + new tokens + the margin, f16 K and V of 30 layers × 3 heads × 64
    assert batch["kv_bytes"] == (150 + 5 + 64) * 2 * 30 * 3 * 64 * 2
    assert batch["extra"]["prompt_tokens_evaluated"] == [150, 150, 150]
    # the server's own peak memory, not the runner's: the server maps the model and holds the
    # slots' KV, the runner has its own copy of the model loaded besides
    assert batch["peak_rss_bytes"] > batch["kv_bytes"] * 3
    assert batch["peak_rss_bytes"] != llama_runner.call("generate", prompt_ids=prompts[0],
                                                        max_new_tokens=2)["peak_rss_bytes"]


def test_batch_prefills_a_repeated_prompt_once_and_restores_it_into_its_other_slots(
        llama_runner):
    shared, other = list(range(1000, 1150)), list(range(2000, 2150))
    batch = llama_runner.call("generate_batch", prompts=[shared, other, shared, shared],
                              max_new_tokens=5)
    singles = [llama_runner.call("generate", prompt_ids=ids, max_new_tokens=5)["token_ids"]
               for ids in (shared, other)]
    assert batch["token_ids"] == [singles[0], singles[1], singles[0], singles[0]]
    # each distinct prompt was prefilled before the batch, in its first slot, and restored
    # into the shared prompt's other slots: every slot then runs only its prompt's last token
    # (a slot without the prompt cached runs all of it: 150, as the batch above shows)
    assert batch["extra"]["prompt_tokens_evaluated"] == [1, 1, 1, 1]
    assert batch["extra"]["shared_prefill_s"] > 0


def test_gemma3_keeps_llama_cpps_swa_cache_and_reports_its_size(tmp_path):
    venv = find_venv(recipes.LLAMACPP)
    if venv is None:
        pytest.skip("the llamacpp venv is not built (snapstream bench peers builds it)")
    system, model = get_system("llama.cpp"), peer_model("gemma3-270m")
    with RunnerProcess(venv.python, RUNNERS / system.runner, tmp_path / "runner.log",
                       env=system.runner_env(venv)) as runner:
        load = runner.call("load", model=str(model.gguf), n_threads=2, n_ctx=2048,
                           attention_windows=list(model.attention_windows), options={})
        assert load["settings"]["swa_full"] is False
        ids = [2, *range(1000, 1300)]
        first = runner.call("generate", prompt_ids=ids, max_new_tokens=4)
        again = runner.call("generate", prompt_ids=ids, max_new_tokens=4)
    assert len(first["token_ids"]) == 4 and first["token_ids"] == again["token_ids"]
    # 3 global layers hold n_ctx = 2048 cells, the 15 sliding ones (window 512) 512 + the
    # 512-token ubatch; 1 KV head of dim 256, K and V in f16
    assert first["kv_bytes"] == (3 * 2048 + 15 * 1024) * 256 * 2 * 2
    assert "sliding-window layers (window 512)" in first["kv_note"]
