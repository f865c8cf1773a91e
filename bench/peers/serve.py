"""Aggregate decode throughput under concurrency: snapstream's in-process serving loop against
llama.cpp's own ``llama-server`` (parallel slots, continuous batching), both driven by the serving
benchmark's load generator (``bench serve``'s in-process and openai systems) on the same
passkey prompts, taking turns round by round.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.peers import recipes
from bench.peers.peer_model import peer_model
from bench.peers.process import RunnerProcess
from bench.peers.runners import RUNNERS
from bench.peers.systems import get_system
from bench.peers.venvs import Echo, ensure_venv, peers_root
from bench.report import markdown_table
from bench.serve_bench import run_serve_bench
from bench.serve_workload import ServeBenchConfig

SLOT_MARGIN = 64  # tokens beyond prompt + new tokens in each llama-server slot


@dataclass(frozen=True)
class PeersServeConfig:
    concurrency: tuple[int, ...] = (4, 16)
    requests: tuple[int, ...] = (8, 16)
    prompt_len: int = 4096
    max_new_tokens: int = 32
    rounds: int = 2
    n_threads: int = 2
    model: str | None = None  # a registry name or a GGUF path; None: the default model

    def __post_init__(self) -> None:
        peer_model(self.model).check_context(self.prompt_len + self.max_new_tokens,
                                             "serve prompt_len + max_new_tokens")

    def serve_config(self, openai_url: str) -> ServeBenchConfig:
        return ServeBenchConfig(
            concurrency=self.concurrency, requests=self.requests, prompt_len=self.prompt_len,
            max_new_tokens=self.max_new_tokens, rows=max(self.concurrency),
            torch_threads=self.n_threads, rounds=self.rounds, warmup=1,
            systems=("in-process", "openai"), openai_url=openai_url,
            # identical prompts come back each round: llama-server would reuse a slot's KV
            openai_fields=(("cache_prompt", False),))


def run_peers_serve(cfg: PeersServeConfig, echo: Echo) -> dict:
    """-> ``run_serve_bench``'s results plus ``llama_server`` (its argv)."""
    system = get_system("llama.cpp")
    venv = ensure_venv(recipes.LLAMACPP, echo)
    gguf = peer_model(cfg.model).gguf
    slot_ctx = cfg.prompt_len + cfg.max_new_tokens + SLOT_MARGIN
    log = peers_root() / "logs" / "llama-server.log"
    with RunnerProcess(venv.python, RUNNERS / system.runner, log,
                       env=system.runner_env(venv)) as runner:
        runner.call("load", model=str(gguf), n_threads=cfg.n_threads, n_ctx=256, options={})
        server = runner.call("serve", timeout_s=300, n_parallel=max(cfg.concurrency),
                             n_ctx_per_slot=slot_ctx, n_threads=cfg.n_threads)
        echo(f"llama-server at {server['openai_base_url']} (log: {log})")
        results = run_serve_bench(cfg.serve_config(server["openai_base_url"]), str(gguf))
    return {**results, "llama_server": server["argv"]}


def throughput_table(serve: dict) -> str:
    """Per concurrency: each system's tokens/s, TTFT and ITL medians, and snapstream over
    llama.cpp within each round."""
    rows = []
    for level in serve["levels"]:
        ratios = [r["in-process"]["throughput_tok_s"] / r["openai"]["throughput_tok_s"]
                  for r in level["rounds"] if r["openai"]["throughput_tok_s"] > 0]
        for name, label in (("in-process", "snapstream"), ("openai", "llama-server")):
            figures = level[name]
            rows.append([level["concurrency"], label, f"{figures['throughput_tok_s']:.1f}",
                         ", ".join(f"{r:.2f}×" for r in ratios) if name == "in-process" else "",
                         f"{figures['ttft_p50_s']:.2f}", f"{figures['itl_p50_s'] * 1e3:.0f}"])
    return markdown_table(["concurrency", "system", "tokens/s", "snapstream / llama.cpp, each "
                           "round", "TTFT p50 s", "ITL p50 ms"], rows)


def render_serve(results: dict, cfg: PeersServeConfig) -> str:
    model = results["model"]
    return "\n".join([
        "### Concurrency: aggregate decode throughput with long prompts", "",
        f"Passkey prompts of {model['prompt_tokens'][0]}–{model['prompt_tokens'][1]} tokens, "
        f"greedy, {cfg.max_new_tokens} new tokens, closed loop at each concurrency "
        f"({', '.join(map(str, cfg.requests))} requests), {cfg.rounds} rounds, the two "
        "systems taking turns; both driven by `bench serve`'s load generator. snapstream: the "
        f"engine and its decode loop in the benchmark's process ({max(cfg.concurrency)} rows, "
        f"policy {results['config']['policy']['kind']}, {cfg.n_threads} torch threads). "
        f"llama.cpp: `{_shown(results['llama_server'][1:])}` through the official openai "
        "client (one token per streamed event). Tokens/s = tokens received / wall time of the "
        "level, prefill included.", "", throughput_table(results)])


def _shown(argv: list[str]) -> str:
    """``argv`` as a command line, files named without this machine's directories."""
    return " ".join(Path(arg).name if Path(arg).is_absolute() else arg for arg in argv)
