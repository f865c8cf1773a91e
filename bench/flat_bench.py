"""Decode cost against context, with the machine's drift taken out: one served model, a prompt
of each length prefilled once (the served path: prefill + the model's default policy), then
the sequences take turns decoding ``tokens`` greedy tokens each, round after round, so every
length is measured in the same minutes. On a shared VM the memory bandwidth moves from one
quarter-hour to the next; lengths measured one after another (as ``bench peers`` does, with a
prefill of minutes between them) mix that drift into the comparison, taking turns does not.

Run: ``snapstream bench flat --model qwen2.5-coder-1.5b --lengths 1024,32000``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.limits import decode_step_bytes, memory_bandwidth, model_bytes, share_of_limit
from bench.peers.peer_model import peer_model
from bench.peers.prompts import load_tokenizer, passkey_prompts
from bench.report import command_line, machine_line, markdown_table, parse_ints, publish
from snapstream.engine import Engine
from snapstream.kvcache import pool_row_bytes


@dataclass(frozen=True)
class FlatBenchConfig:
    lengths: tuple[int, ...] = (1024, 32000)
    tokens: int = 32  # decode steps per sequence and round
    rounds: int = 5
    threads: int = 2
    model: str | None = None  # a registry name or a GGUF path; None: the default model

    def __post_init__(self) -> None:
        if len(self.lengths) < 2 or min(self.lengths) < 1:
            raise ValueError(f"lengths: want two or more positive lengths, got {self.lengths}")
        if self.tokens < 2 or self.rounds < 1 or self.threads < 1:
            raise ValueError("tokens must be ≥ 2, rounds and threads ≥ 1")


class _Sequence:
    """One prefilled prompt with a decoder of its own, decoded greedily a few steps at a time."""

    def __init__(self, engine: Engine, ids: list[int], max_new: int) -> None:
        policy = engine.default_policy
        result = engine.prefill(ids, policy, max_new)
        self.layout = result.cache.layout
        self.decoder = engine.new_decoder(self.layout, 1)
        self.decoder.cache.insert(0, result.cache)
        self.token = torch.tensor([int(result.logits.argmax())])  # (1,)
        self.position = torch.tensor([len(ids)])  # (1,)

    def steps(self, count: int) -> list[float]:
        """Seconds of each of ``count`` decode steps."""
        times = []
        for _ in range(count):
            start = time.perf_counter()
            self.token = self.decoder.step(self.token, self.position).argmax(dim=-1)  # (1,)
            times.append(time.perf_counter() - start)
            self.position += 1
        return times


def run_flat_bench(cfg: FlatBenchConfig) -> dict:
    torch.set_num_threads(cfg.threads)
    model = peer_model(cfg.model)
    engine = Engine.from_pretrained(cfg.model)  # as served: the format and KV dtype it picks
    tokenizer = load_tokenizer(model.gguf, print)
    prompts = passkey_prompts(tokenizer, cfg.lengths)
    max_new = cfg.tokens * cfg.rounds + 1
    sequences = {}
    for length, prompt in zip(cfg.lengths, prompts, strict=True):
        start = time.perf_counter()
        sequences[length] = _Sequence(engine, list(prompt.token_ids), max_new)
        print(f"{length} tokens prefilled in {time.perf_counter() - start:.1f} s", flush=True)
    medians: dict[int, list[float]] = {length: [] for length in cfg.lengths}
    for round_index in range(cfg.rounds):
        for length in cfg.lengths if round_index % 2 == 0 else cfg.lengths[::-1]:
            medians[length].append(statistics.median(sequences[length].steps(cfg.tokens)))
        print(f"round {round_index + 1}/{cfg.rounds}: " + ", ".join(
            f"{length}: {medians[length][-1] * 1e3:.1f} ms" for length in cfg.lengths), flush=True)
    weights = model_bytes(engine.model)
    row = pool_row_bytes(engine.config, sequences[cfg.lengths[0]].layout, engine.kv_dtype)
    return {"model": model.title, "lengths": list(cfg.lengths), "medians_s": medians,
            "step_bytes": decode_step_bytes(weights, row, 1), "kv_row_bytes": row,
            "bandwidth_gb_s": memory_bandwidth()}


def render(results: dict, cfg: FlatBenchConfig) -> str:
    lengths = results["lengths"]
    base = statistics.median(results["medians_s"][lengths[0]])
    bandwidth = results["bandwidth_gb_s"]
    rows = []
    for length in lengths:
        values = results["medians_s"][length]
        step = statistics.median(values)
        rows.append([length, f"{step * 1e3:.1f}", f"{step / base:.3f}x",
                     ", ".join(f"{v * 1e3:.1f}" for v in values),
                     f"{share_of_limit(step, results['step_bytes'], bandwidth * 1e9):.0%}"])
    kv_mib = results["kv_row_bytes"] / 2**20
    return "\n".join([
        f"## Decode cost against context, lengths taking turns: {results['model']}", "",
        f"Command: `{command_line()}`  ",
        f"Machine: {machine_line()}; {cfg.threads} threads  ",
        "Each prompt (licence texts with a passkey, as `bench peers` builds them) prefilled once "
        f"through the served path (prefill + the model's default policy, {kv_mib:.1f} MiB of "
        f"KV a sequence), then the sequences take turns, {cfg.rounds} rounds of {cfg.tokens} "
        "greedy decode steps each (the order reversed every other round). ms per step: the "
        "median over rounds of each round's median; % of bandwidth: the weights and the "
        f"sequence's KV read once a step over the step, against {bandwidth:.1f} GB/s "
        "(`torch.sum` over 1 GiB, best of 5, after the rounds).", "",
        markdown_table(["prompt tokens", "ms per decode step", f"/ {lengths[0]} tokens",
                        "each round's median, ms", "% of bandwidth"], rows)])


def register(parser: argparse.ArgumentParser) -> None:
    defaults = FlatBenchConfig()
    parser.add_argument("--model", default=None,
                        help="a registry name or a GGUF path (default: the default model)")
    parser.add_argument("--lengths", default=",".join(map(str, defaults.lengths)))
    parser.add_argument("--tokens", type=int, default=defaults.tokens,
                        help="decode steps per sequence and round")
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))


def run(args: argparse.Namespace) -> int:
    cfg = FlatBenchConfig(lengths=parse_ints(args.lengths), tokens=args.tokens,
                          rounds=args.rounds, threads=args.threads, model=args.model)
    results = run_flat_bench(cfg)
    publish(render(results, cfg), peer_model(cfg.model).section("flat"), args.doc)
    return 0
