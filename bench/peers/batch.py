"""Aggregate decode throughput with long contexts: each system generates for ``c`` prompts at
once under its own batching (snapstream: one static decode step over ``c`` rows; OpenVINO
GenAI: its continuous-batching scheduler; llama.cpp: ``llama-server`` with ``c`` slots), the
systems taking turns round by round.

The figure is measured in the **decode window** of each batch: from the moment the last
sequence got its first token (every prompt prefilled) to the moment the first sequence got its
last one. Every sequence is decoding throughout, no prompt is being processed, so tokens/s there
is the system's decode throughput at concurrency ``c`` with those contexts.

With ``shared_prompt`` every sequence gets the same prompt and each system prefills it once
where it can (snapstream: one prefill, its compressed cache put into every row; llama-server:
one slot prefilled, saved and restored into the others), so that on 2 cores a long prompt costs
one prefill instead of ``c`` and the decode window opens at all: llama-server prefills distinct
slots one after another while the finished ones decode a token per prompt batch. The sequences
stay independent: each holds and reads its own copy of the context.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass

from bench.peers.bench import Peer, _stderr, started_peer
from bench.peers.peer_model import peer_model
from bench.peers.process import RunnerError
from bench.peers.prompts import Prompt, distinct_passkey_prompts, load_tokenizer
from bench.peers.report import capped_title
from bench.peers.runners.peer_protocol import median
from bench.peers.systems import PeerBudget, get_system
from bench.peers.venvs import Echo, PeerBuildError
from bench.report import command_line, machine_line, markdown_table

SLOT_MARGIN = 64  # context tokens beyond prompt + new tokens


@dataclass(frozen=True)
class PeersBatchConfig:
    systems: tuple[str, ...] = ("llama.cpp", "snapstream", "snapstream-fp32", "openvino",
                                "openvino-evict")
    concurrency: tuple[int, ...] = (4, 16)
    prompt_len: int = 4096
    max_new_tokens: int = 128
    rounds: int = 2
    n_threads: int = 2
    model: str | None = None  # a registry name or a GGUF path; None: the default model
    budget: PeerBudget | None = None  # None: the model's policy
    timeout_s: float = 3600.0
    shared_prompt: bool = False  # one prompt for every sequence, prefilled once where it can be

    def __post_init__(self) -> None:
        if self.budget is None:
            object.__setattr__(self, "budget", peer_model(self.model).budget)
        for name in self.systems:
            get_system(name)
        if self.max_new_tokens < 8:
            raise ValueError("max_new_tokens must be ≥ 8: the decode window needs tokens")
        if min(self.concurrency, default=0) < 1 or min(self.rounds, self.n_threads) < 1:
            raise ValueError("concurrency, rounds and n_threads must be ≥ 1")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        peer_model(self.model).check_context(self.prompt_len + self.max_new_tokens,
                                             "prompt_len + new tokens")

    @property
    def n_ctx(self) -> int:
        return self.prompt_len + self.max_new_tokens + SLOT_MARGIN


def decode_window(stamps_s: list[list[float]]) -> dict:
    """The decode window of one batch (``stamps_s[i]``: when sequence i's tokens came out) ->
    its length, the tokens that came out in it (after its start) and their rate; a rate of
    None when the window is empty (a sequence finished before the last one started)."""
    start = max(row[0] for row in stamps_s)
    end = min(row[-1] for row in stamps_s)
    if end <= start:
        return {"window_s": 0.0, "tokens": 0, "tok_s": None}
    tokens = sum(start < stamp <= end for row in stamps_s for stamp in row)
    return {"window_s": end - start, "tokens": tokens, "tok_s": tokens / (end - start)}


def batch_figures(reply: dict, prompts: list[Prompt], tokenizer) -> dict:
    stamps = reply["stamps_s"]
    finished = max(row[-1] for row in stamps)
    found = sum(p.passkey in tokenizer.decode(ids)
                for p, ids in zip(prompts, reply["token_ids"], strict=True))
    return {**decode_window(stamps), "ttft_p50_s": median([row[0] for row in stamps]),
            "total_tok_s": sum(map(len, stamps)) / finished, "kv_bytes": reply["kv_bytes"],
            "kv_note": reply["kv_note"], "peak_rss_bytes": reply["peak_rss_bytes"],
            "passkeys_found": found, "other_cores_busy": reply["other_cores_busy"],
            "extra": reply["extra"]}


def run_peers_batch(cfg: PeersBatchConfig, echo: Echo | None = None) -> dict:
    echo = echo or _stderr
    model = peer_model(cfg.model)
    tokenizer = load_tokenizer(model.gguf, echo)
    count = max(cfg.concurrency)
    prompts = (distinct_passkey_prompts(tokenizer, cfg.prompt_len, 1) * count
               if cfg.shared_prompt else
               distinct_passkey_prompts(tokenizer, cfg.prompt_len, count))
    results: dict[str, dict[int, list[dict]]] = {}
    failures: dict[str, str] = {}
    with ExitStack() as stack:
        peers: list[Peer] = []
        for name in cfg.systems:
            try:
                peers.append(stack.enter_context(started_peer(
                    get_system(name), model, n_threads=cfg.n_threads, n_ctx=cfg.n_ctx,
                    budget=cfg.budget, timeout_s=cfg.timeout_s, echo=echo)))
            except (PeerBuildError, RunnerError) as exc:
                failures[name] = str(exc)
                echo(f"{name}: skipped: {exc}")
        total = cfg.rounds * len(cfg.concurrency) * len(peers)
        done, began = 0, time.perf_counter()
        for round_index in range(cfg.rounds):
            for level_index, c in enumerate(cfg.concurrency):
                shift = (round_index + level_index) % max(len(peers), 1)
                for peer in peers[shift:] + peers[:shift]:
                    name = peer.system.name
                    figures = _one_batch(peer, prompts[:c], cfg, tokenizer, failures)
                    done += 1
                    eta = (time.perf_counter() - began) / done * (total - done)
                    where = f"round {round_index + 1}/{cfg.rounds} · c={c} · {name}"
                    if figures is None:
                        echo(f"{where}: failed: {failures[name]} [{done}/{total}]")
                        continue
                    results.setdefault(name, {}).setdefault(c, []).append(figures)
                    rate = figures["tok_s"]
                    echo(f"{where}: decode {'—' if rate is None else f'{rate:.1f}'} tok/s, "
                         f"TTFT p50 {figures['ttft_p50_s']:.1f} s, other jobs kept "
                         f"{figures['other_cores_busy']:.1f} cores busy "
                         f"[{done}/{total}, ETA {eta / 60:.1f} min]")
    labels = {name: get_system(name).label for name in results}
    return {"model": str(model.gguf), "prompt_tokens": cfg.prompt_len, "results": results,
            "labels": labels, "failures": failures}


def _one_batch(peer: Peer, prompts: list[Prompt], cfg: PeersBatchConfig, tokenizer,
               failures: dict[str, str]) -> dict | None:
    name = peer.system.name
    if name in failures:
        return None
    try:
        reply = peer.measured_call(
            "generate_batch", timeout_s=cfg.timeout_s,
            prompts=[list(p.token_ids) for p in prompts], max_new_tokens=cfg.max_new_tokens,
            options=peer.system.generate_options(cfg.prompt_len, cfg.budget))
    except RunnerError as exc:
        failures[name] = str(exc)
        return None
    return batch_figures(reply, prompts, tokenizer)


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def batch_table(results: dict, baseline: str) -> str:
    rows = []
    levels = sorted({c for per_level in results["results"].values() for c in per_level})
    for c in levels:
        base = results["results"].get(baseline, {}).get(c, [])
        for name, per_level in results["results"].items():
            runs = per_level.get(c)
            if not runs:
                continue
            rates = [r["tok_s"] for r in runs if r["tok_s"] is not None]
            ratios = [r["tok_s"] / b["tok_s"] for r, b in zip(runs, base, strict=False)
                      if r["tok_s"] and b["tok_s"]]
            steps = [r["window_s"] / (r["tokens"] / c) * 1e3 for r in runs if r["tokens"]]
            kv = runs[-1]["kv_bytes"]
            rows.append([
                c, name, _rate(median(rates)) if rates else "—",
                ", ".join(f"{x:.2f}×" for x in ratios) if name != baseline else "",
                f"{median(steps):.0f}" if steps else "—",
                f"{median([r['ttft_p50_s'] for r in runs]):.1f}",
                f"{median([r['total_tok_s'] for r in runs]):.1f}",
                "—" if kv is None else f"{kv / 2**20:.1f}",
                f"{runs[-1]['peak_rss_bytes'] / 2**20:.0f}",
                f"{min(r['passkeys_found'] for r in runs)}/{c}",
                ", ".join(f"{r['other_cores_busy']:.1f}" for r in runs)])
    return markdown_table(
        ["concurrency", "system", "decode tok/s", f"/ {baseline}, each round",
         "ms per decode step", "TTFT p50 s", "tok/s incl. prefill", "KV MiB/seq",
         "peak RSS MiB", "passkeys found", "other jobs' cores, each round"], rows)


def render_batch(results: dict, cfg: PeersBatchConfig, baseline: str) -> str:
    systems = "\n".join(f"- **{name}**: {label}" for name, label in results["labels"].items())
    failed = "\n".join(f"- {name}: {why}" for name, why in results["failures"].items())
    workload = (f"one {cfg.prompt_len}-token passkey prompt for every sequence, prefilled once "
                "where the system can (snapstream: one prefill, its cache put into every row; "
                "llama-server: one slot prefilled, saved and restored into the others; each "
                "sequence then holds and reads its own copy)" if cfg.shared_prompt else
                f"{cfg.prompt_len}-token passkey prompts that share no prefix")
    return "\n".join([
        f"## Peers on {peer_model(cfg.model).title}: aggregate decode throughput of "
        f"{'/'.join(map(str, cfg.concurrency))} sequences at once{capped_title()}", "",
        f"Command: `{command_line()}`  ",
        f"Machine: {machine_line()}; {cfg.n_threads} threads per system  ",
        f"{workload[0].upper()}{workload[1:]}, greedy, "
        f"{cfg.max_new_tokens} new tokens each; at each concurrency c, the c prompts go to the "
        f"system at once, {cfg.rounds} rounds, the systems taking turns. **Decode tok/s** is "
        "counted in the decode window (from the last sequence's first token to the first "
        "sequence's last: every sequence decoding, no prompt being processed); ms per decode "
        "step = window / tokens per sequence in it; tok/s incl. prefill = all tokens / the "
        "batch's wall time; KV per sequence as each system holds it; peak RSS so far of the "
        "process that serves the batch (the runner; llama-server for llama.cpp); other jobs' "
        "cores = the cores that other processes (and, on a virtual machine, its host's other "
        "guests: steal) kept busy during the batch. Ratios within "
        "each round.", "", batch_table(results, baseline), "",
        "Systems:", "", systems, *(["", "Failed:", "", failed] if failed else [])])

