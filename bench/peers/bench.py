"""Batch-1 decode speed and time to first token of the peer systems on the same prompt ids.

Every system loads the model once in its own runner process; then each round sends every
prompt length to every system, the systems taking turns (the starting system rotates), so the
machine's load falls on all of them alike and same-round ratios can be taken.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.limits import context_kv_bytes, gemm_peak, memory_bandwidth, prompt_flops
from bench.peers.peer_model import PeerModel, peer_model
from bench.peers.process import RunnerError, RunnerProcess
from bench.peers.prompts import Prompt, load_tokenizer, passkey_prompts
from bench.peers.runners import RUNNERS
from bench.peers.systems import PeerBudget, PeerSystem, get_system
from bench.peers.venvs import Echo, PeerBuildError, Venv, ensure_venv, peers_root
from bench.serve_profile import machine_cpu_s, process_tree_cpu_s
from snapstream.checkpoints import open_checkpoint

WARMUP_TOKENS = 256


@dataclass(frozen=True)
class PeersBenchConfig:
    systems: tuple[str, ...] = ("llama.cpp", "snapstream", "snapstream-fp32", "snapstream-full",
                                "openvino", "openvino-evict", "transformers", "kvpress-snapkv")
    lengths: tuple[int, ...] = (1024, 4096, 8000)
    max_new_tokens: int = 32
    rounds: int = 3
    n_threads: int = 2
    model: str | None = None  # a registry name or a GGUF path; None: the default model
    budget: PeerBudget | None = None  # None: the model's policy
    # (system, tokens): that system is not given longer prompts (too slow or too big for the
    # machine); the table says so at those lengths
    max_lengths: tuple[tuple[str, int], ...] = ()
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.budget is None:
            object.__setattr__(self, "budget", peer_model(self.model).budget)
        for name in (*self.systems, *(name for name, _ in self.max_lengths)):
            get_system(name)  # names the known ones when one is unknown
        if self.max_new_tokens < 2:
            raise ValueError("max_new_tokens must be ≥ 2: decode speed is timed between tokens")
        if min(self.rounds, self.n_threads) < 1:
            raise ValueError("rounds and n_threads must be ≥ 1")
        if min(self.lengths) <= WARMUP_TOKENS:
            raise ValueError(f"lengths must exceed the {WARMUP_TOKENS}-token warm-up prompt")
        peer_model(self.model).check_context(self.n_ctx, "lengths + max_new_tokens")
        if any(tokens <= WARMUP_TOKENS for _, tokens in self.max_lengths):
            raise ValueError(f"max_lengths must exceed the {WARMUP_TOKENS}-token warm-up prompt")

    def runs(self, system: str, prompt_len: int) -> bool:
        """Whether ``system`` is given a prompt of ``prompt_len`` tokens."""
        return prompt_len <= dict(self.max_lengths).get(system, prompt_len)

    @property
    def n_ctx(self) -> int:
        """The runners' context: the longest prompt + new tokens."""
        return max(self.lengths) + self.max_new_tokens


@dataclass
class Peer:
    """A running system: its runner, what it reported, and its measurements."""

    system: PeerSystem
    runner: RunnerProcess
    venv: Venv | None
    load: dict
    results: dict[int, list[dict]] = field(default_factory=dict)
    failure: str | None = None

    def generate(self, prompt_ids: list[int], max_new_tokens: int, budget: PeerBudget,
                 timeout_s: float) -> dict | None:
        """One measurement (``measured_call``'s reply), or None once this system has failed
        (the failure is kept)."""
        if self.failure:
            return None
        try:
            return self.measured_call(
                "generate", timeout_s=timeout_s, prompt_ids=prompt_ids,
                max_new_tokens=max_new_tokens,
                options=self.system.generate_options(len(prompt_ids), budget))
        except RunnerError as exc:
            self.failure = str(exc)
            return None

    def measured_call(self, method: str, timeout_s: float, **args) -> dict:
        """The runner's ``method``; its reply gains ``other_cores_busy``: the cores that
        processes other than this runner (with its children: llama-server) and this process
        kept busy meanwhile (other people's
        jobs on a shared machine, and the CPU time a virtual machine's host gave to other
        guests: steal)."""
        before = self._cpu_s()
        reply = self.runner.call(method, timeout_s=timeout_s, **args)
        wall, machine, ours = (after - first for after, first in zip(self._cpu_s(), before,
                                                                      strict=True))
        reply["other_cores_busy"] = (machine - ours) / wall
        return reply

    def _cpu_s(self) -> tuple[float, float, float]:
        """(wall, machine busy, this runner's process tree + this process) in seconds."""
        ours = process_tree_cpu_s(self.runner.pid) + time.process_time()
        return time.perf_counter(), machine_cpu_s(), ours


def run_peers_bench(cfg: PeersBenchConfig, echo: Echo | None = None) -> dict:
    echo = echo or _stderr
    model = peer_model(cfg.model)
    tokenizer = load_tokenizer(model.gguf, echo)
    prompts = passkey_prompts(tokenizer, cfg.lengths)
    failures: dict[str, str] = {}
    limits = machine_limits(model, [len(p.token_ids) for p in prompts], echo)
    with ExitStack() as stack:
        peers = []
        for name in cfg.systems:
            try:
                peers.append(stack.enter_context(started_peer(
                    get_system(name), model, n_threads=cfg.n_threads, n_ctx=cfg.n_ctx,
                    budget=cfg.budget, timeout_s=cfg.timeout_s, echo=echo)))
            except (PeerBuildError, RunnerError) as exc:
                failures[name] = str(exc)
                echo(f"{name}: skipped: {exc}")
        _warm_up(peers, prompts[0], cfg.budget, echo)
        _measure(peers, prompts, cfg, echo)
    return {"model": str(model.gguf),
            "prompts": [{"tokens": len(p.token_ids), "passkey": p.passkey} for p in prompts],
            "systems": {p.system.name: _summary(p, prompts, tokenizer) for p in peers},
            "failures": failures, "max_lengths": dict(cfg.max_lengths), "limits": limits}


def machine_limits(model: PeerModel, lengths: list[int], echo: Echo) -> dict:
    """The memory bandwidth and plain-GEMM peak, measured before any system starts, and what
    the report sets against them: the GGUF's bytes, each prompt's FLOPs
    (:func:`bench.limits.prompt_flops`) and its full float16 KV
    (:func:`bench.limits.context_kv_bytes`; JSON keys are strings)."""
    echo("measuring the machine's memory bandwidth and GEMM peak")
    config = open_checkpoint(model.gguf).config
    peak = max(rate for by_dtype in gemm_peak().values() for rate in by_dtype.values())
    return {"bandwidth_gb_s": memory_bandwidth(), "gemm_gflop_s": peak,
            "weights_bytes": model.gguf.stat().st_size,
            "prompt_flops": {str(n): prompt_flops(config, n) for n in lengths},
            "context_kv_bytes": {str(n): context_kv_bytes(config, n) for n in lengths}}


@contextmanager
def started_peer(system: PeerSystem, model: PeerModel, *, n_threads: int, n_ctx: int,
                 budget: PeerBudget, timeout_s: float, echo: Echo) -> Iterator[Peer]:
    """``system``'s runner, its venv built first if needed, with the model loaded (it is told
    the layers' attention windows, which size llama.cpp's SWA cache)."""
    venv = ensure_venv(system.venv, echo) if system.venv else None
    path = system.prepare(model.gguf, venv, echo)
    python = venv.python if venv else Path(sys.executable)
    env = {"OMP_NUM_THREADS": str(n_threads), **system.runner_env(venv)}
    log = peers_root() / "logs" / f"{system.name}.log"
    echo(f"{system.name}: starting its runner (log: {log})")
    with RunnerProcess(python, RUNNERS / system.runner, log, env=env) as runner:
        load = runner.call("load", timeout_s=timeout_s, model=str(path), n_threads=n_threads,
                           n_ctx=n_ctx, attention_windows=list(model.attention_windows),
                           options=system.load_options(budget))
        echo(f"{system.name}: model loaded in {load['load_s']:.1f} s")
        yield Peer(system, runner, venv, load)


def _warm_up(peers: list[Peer], prompt: Prompt, budget: PeerBudget, echo: Echo) -> None:
    ids = list(prompt.token_ids[:WARMUP_TOKENS])
    for peer in peers:
        echo(f"{peer.system.name}: warm-up")
        if peer.generate(ids, 4, budget, timeout_s=600) is None:
            echo(f"{peer.system.name}: failed: {peer.failure}")


def _measure(peers: list[Peer], prompts: list[Prompt], cfg: PeersBenchConfig,
             echo: Echo) -> None:
    total = cfg.rounds * sum(cfg.runs(peer.system.name, len(prompt.token_ids))
                             for peer in peers for prompt in prompts)
    done, start = 0, time.perf_counter()
    for round_index in range(cfg.rounds):
        for prompt_index, prompt in enumerate(prompts):
            shift = (round_index + prompt_index) % max(len(peers), 1)
            for peer in peers[shift:] + peers[:shift]:
                if not cfg.runs(peer.system.name, len(prompt.token_ids)):
                    continue
                reply = peer.generate(list(prompt.token_ids), cfg.max_new_tokens, cfg.budget,
                                      cfg.timeout_s)
                done += 1
                eta = (time.perf_counter() - start) / done * (total - done)
                where = (f"round {round_index + 1}/{cfg.rounds} · {len(prompt.token_ids)} "
                         f"tokens · {peer.system.name}")
                progress = f"[{done}/{total}, ETA {eta / 60:.1f} min]"
                if reply is None:
                    echo(f"{where}: failed: {peer.failure} {progress}")
                    continue
                peer.results.setdefault(len(prompt.token_ids), []).append(reply)
                echo(f"{where}: TTFT {reply['ttft_ms'] / 1e3:.2f} s, decode "
                     f"{reply['decode_ms_per_token']:.1f} ms/token, other jobs kept "
                     f"{reply['other_cores_busy']:.1f} cores busy {progress}")


def _summary(peer: Peer, prompts: list[Prompt], tokenizer) -> dict:
    points = {}
    for prompt in prompts:
        replies = peer.results.get(len(prompt.token_ids))
        if not replies:
            continue
        text = tokenizer.decode(replies[0]["token_ids"])
        points[len(prompt.token_ids)] = {
            "decode_ms_per_token": [r["decode_ms_per_token"] for r in replies],
            "ttft_ms": [r["ttft_ms"] for r in replies],
            "other_cores_busy": [r["other_cores_busy"] for r in replies],
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in replies),
            "kv_bytes": replies[-1]["kv_bytes"], "kv_note": replies[-1]["kv_note"],
            "token_ids": replies[0]["token_ids"], "text": text,
            "same_tokens_every_round": all(r["token_ids"] == replies[0]["token_ids"]
                                           for r in replies),
            "passkey_found": prompt.passkey in text, "extra": replies[-1]["extra"]}
    info = peer.venv.info if peer.venv else {}
    return {"label": peer.system.label, "hello": peer.runner.hello, "load": peer.load,
            "venv": str(peer.venv.path) if peer.venv else sys.prefix,
            "venv_build_s": info.get("build_s"), "venv_versions": info.get("versions", []),
            "points": points, "failure": peer.failure}


def _stderr(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
