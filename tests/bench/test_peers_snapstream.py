"""snapstream's own peer runner on a tiny random checkpoint, through the runner protocol."""

from __future__ import annotations

import multiprocessing
import sys

import pytest
import torch

from bench.peers.bench import Peer
from bench.peers.process import RunnerProcess
from bench.peers.runners import RUNNERS
from bench.peers.systems import PeerBudget, get_system
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.sampling_params import SamplingParams
from tests.tiny_models import write_tiny_model

BUDGET = PeerBudget(total=48, n_sink=4, n_recent=16, observation=8, kernel=31)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model", context=512)


@pytest.fixture(scope="module")
def runner(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("runner") / "snapstream.log"
    env = get_system("snapstream").runner_env(None)  # this checkout's snapstream
    with RunnerProcess(sys.executable, RUNNERS / "run_snapstream.py", log, env=env) as process:
        load = process.call("load", model=str(tiny_dir), n_threads=1, n_ctx=512, options={})
        assert load["warm_up_s"] > 0  # as a prefill worker starts
        yield process


def _generate(runner, name: str, prompt_ids: list[int]) -> dict:
    options = get_system(name).generate_options(len(prompt_ids), BUDGET)
    return runner.call("generate", prompt_ids=prompt_ids, max_new_tokens=6, options=options)


def test_snapstream_keeps_one_kv_size_and_matches_the_engine(runner, tiny_dir):
    short, long = list(range(3, 40)), [3 + i % 200 for i in range(300)]
    first, second = _generate(runner, "snapstream", short), _generate(runner, "snapstream", long)
    assert first["kv_bytes"] == second["kv_bytes"] and second["extra"]["slots"] == BUDGET.total
    policy = CachePolicy(n_sink=4, n_topk=28, n_recent=16, observation=8)
    engine = Engine.from_pretrained(tiny_dir)
    expected = engine.generate(long, 6, policy=policy,
                               sampling=SamplingParams(temperature=0, ignore_eos=True))
    assert second["token_ids"] == expected.token_ids
    assert len(second["token_ids"]) == 6 and second["decode_ms_per_token"] > 0
    # KV bytes: what the sequence's row of a decode pool really holds
    pool = engine.new_decoder(engine.model_layout(policy.layout(300, 6)), 1).cache
    assert second["kv_bytes"] == sum(t.nbytes for g in pool.groups for t in (g.k, g.v, g.filled))


def test_full_policy_kv_grows_with_the_prompt(runner):
    short, long = list(range(3, 40)), [3 + i % 200 for i in range(300)]
    first, second = _generate(runner, "snapstream-full", short), _generate(
        runner, "snapstream-full", long)
    assert first["extra"]["slots"] == 37 + 6 and second["extra"]["slots"] == 300 + 6
    assert second["kv_bytes"] > first["kv_bytes"]


def test_batch_decodes_every_row_in_one_step_as_single_requests_would(runner):
    prompts = [[3 + (i * 7 + j) % 200 for j in range(120)] for i in range(3)]
    options = get_system("snapstream").generate_options(120, BUDGET)
    batch = runner.call("generate_batch", prompts=prompts, max_new_tokens=6, options=options)
    singles = [runner.call("generate", prompt_ids=ids, max_new_tokens=6, options=options)
               for ids in prompts]
    assert batch["token_ids"] == [single["token_ids"] for single in singles]
    stamps = batch["stamps_s"]
    firsts = [row[0] for row in stamps]
    assert firsts == sorted(firsts)  # prefilled one by one
    # after the prefills, one step gives every row its token at the same moment
    for later in zip(*(row[1:] for row in stamps), strict=True):
        assert len(set(later)) == 1 and later[0] > firsts[-1]
    assert batch["kv_bytes"] == singles[0]["kv_bytes"]


def test_batch_prefills_a_repeated_prompt_once(runner):
    shared, other = [3 + j % 200 for j in range(120)], [5 + j % 190 for j in range(120)]
    options = get_system("snapstream").generate_options(120, BUDGET)
    batch = runner.call("generate_batch", prompts=[shared, shared, other], max_new_tokens=6,
                        options=options)
    singles = [runner.call("generate", prompt_ids=ids, max_new_tokens=6, options=options)
               for ids in (shared, other)]
    assert batch["extra"]["prefills"] == 2
    assert batch["token_ids"] == [singles[0]["token_ids"]] * 2 + [singles[1]["token_ids"]]


def test_a_measured_batch_counts_the_cores_other_processes_kept_busy(runner):
    system = get_system("snapstream")
    peer = Peer(system=system, runner=runner, venv=None, load={})
    prompts = [[3 + (i * 5 + j) % 200 for j in range(80)] for i in range(2)]
    context = multiprocessing.get_context("spawn")
    stop, spinning = context.Event(), context.Event()
    other_job = context.Process(target=_spin, args=(spinning, stop))  # another job meanwhile
    other_job.start()
    try:
        assert spinning.wait(60)
        # 400 steps: a window of tenths of a second, long against /proc/stat's 10 ms ticks (6
        # steps took ~20 ms here, where a tick more or less is half a core)
        reply = peer.measured_call("generate_batch", timeout_s=60, prompts=prompts,
                                   max_new_tokens=400,
                                   options=system.generate_options(80, BUDGET))
    finally:
        stop.set()
        other_job.join(60)
    assert reply["other_cores_busy"] > 0.5  # one core spinning throughout: ~1.0
    assert len(reply["token_ids"]) == 2


def _spin(spinning, stop) -> None:
    spinning.set()
    while not stop.is_set():
        pass


def test_bf16_system_serves_a_bfloat16_kv_cache(tiny_dir, tmp_path):
    system = get_system("snapstream-bf16")
    prompt_ids = [3 + i % 200 for i in range(300)]
    with RunnerProcess(sys.executable, RUNNERS / "run_snapstream.py",
                       tmp_path / "bf16.log") as process:
        loaded = process.call("load", model=str(tiny_dir), n_threads=1, n_ctx=512,
                              options=system.load_options(BUDGET))
        reply = process.call("generate", prompt_ids=prompt_ids, max_new_tokens=6,
                             options=system.generate_options(len(prompt_ids), BUDGET))
    assert loaded["settings"]["kv_cache"] == "bfloat16"
    engine = Engine.from_pretrained(tiny_dir, kv_dtype="bfloat16")
    policy = CachePolicy(n_sink=4, n_topk=28, n_recent=16, observation=8)
    expected = engine.generate(prompt_ids, 6, policy=policy,
                               sampling=SamplingParams(temperature=0, ignore_eos=True))
    assert reply["token_ids"] == expected.token_ids
    pool = engine.new_decoder(engine.model_layout(policy.layout(300, 6)), 1).cache
    assert reply["kv_bytes"] == sum(t.nbytes for g in pool.groups for t in (g.k, g.v, g.filled))
    assert pool.groups[0].k.dtype == torch.bfloat16
