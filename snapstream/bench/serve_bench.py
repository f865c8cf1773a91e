"""`bench serve`, serving part: the same prompts at each concurrency through the router (a local
cluster) and through the in-process engine; latency, throughput, goodput and where time goes."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, replace

import torch

from kvstore.codec import BlobSpec
from snapstream.bench.serve_inprocess import InProcessServer
from snapstream.bench.serve_profile import Usage, usage_now
from snapstream.bench.serve_router import RouterClient, serving_cluster
from snapstream.bench.serve_workload import (
    Generate,
    RequestTrace,
    ServeBenchConfig,
    make_prompts,
    run_level,
    summarize,
)
from snapstream.client import AsyncSnapstreamClient
from snapstream.cluster import LocalCluster
from snapstream.engine import Engine

SYSTEMS = ("in-process", "router")
CALL_TIMEOUT_S = 600.0
ROUND_FIGURES = ("ttft_p50_s", "itl_p50_s", "throughput_tok_s")  # kept per round, for the spread


def run_serve_bench(cfg: ServeBenchConfig, model: str | None) -> dict:
    """-> {"config", "model", "levels": [{"concurrency", "in-process", "router",
    "identical_outputs"}]}, each system's figures with the "profile" of its runs."""
    if cfg.torch_threads:  # the in-process engine gets what each cluster worker gets
        torch.set_num_threads(cfg.torch_threads)
    engine = Engine.from_pretrained(model)
    cfg = replace(cfg, policy=cfg.policy or engine.default_policy)
    prompts = make_prompts(cfg, engine.tokenizer, cfg.warmup + max(cfg.requests))
    server = InProcessServer(engine, cfg)
    try:
        with serving_cluster(cfg, model) as cluster:
            levels = asyncio.run(_measure(cfg, server, cluster, prompts))
    finally:
        server.close()
    return {"config": asdict(cfg), "model": _describe(engine, cfg, prompts),
            "levels": levels}


async def _measure(cfg: ServeBenchConfig, server: InProcessServer, cluster: LocalCluster,
                   prompts: list[list[int]]) -> list[dict]:
    warm, measured = prompts[:cfg.warmup], prompts[cfg.warmup:]
    router = cluster.endpoints["router"]
    async with AsyncSnapstreamClient(router, timeout_s=CALL_TIMEOUT_S) as client:
        systems: dict[str, Generate] = {"in-process": server.generate,
                                        "router": RouterClient(client, cfg).generate}
        if warm:
            for name, generate in systems.items():
                await run_level(generate, warm, len(warm), f"warm-up {name}")
        return [await _level(cfg, systems, cluster, measured[:count], concurrency)
                for concurrency, count in zip(cfg.concurrency, cfg.requests, strict=True)]


async def _level(cfg: ServeBenchConfig, systems: dict[str, Generate], cluster: LocalCluster,
                 prompts: list[list[int]], concurrency: int) -> dict:
    """Every system sends ``prompts`` once per round; the order alternates between rounds
    (A B, B A, ...) so that slow drifts in the machine's load fall on both alike."""
    traces: dict[str, list[RequestTrace]] = {name: [] for name in systems}
    wall_s = dict.fromkeys(systems, 0.0)
    usage: dict[str, Usage] = {}
    rounds: list[dict[str, dict]] = []  # each round's own figures: the spread between runs
    for round_index in range(cfg.rounds):
        rounds.append({})
        for name in list(systems)[:: 1 if round_index % 2 == 0 else -1]:
            before = await asyncio.to_thread(usage_now, cluster.metrics, cluster.pids)
            run, run_s = await run_level(systems[name], prompts, concurrency,
                                         f"{name} c={concurrency} round {round_index + 1}")
            used = await asyncio.to_thread(usage_now, cluster.metrics, cluster.pids) - before
            traces[name] += run
            wall_s[name] += run_s
            usage[name] = usage[name] + used if name in usage else used
            rounds[-1][name] = {key: value for key, value in summarize(run, run_s, cfg.slo).items()
                                if key in ROUND_FIGURES}
    level: dict = {"concurrency": concurrency, "rounds": rounds}
    for name in systems:
        level[name] = {**summarize(traces[name], wall_s[name], cfg.slo),
                       "profile": usage[name].summary()}
    level["identical_outputs"] = sum(
        a.token_ids == b.token_ids for a, b in zip(*traces.values(), strict=True))
    return level


def _describe(engine: Engine, cfg: ServeBenchConfig,
              prompts: list[list[int]]) -> dict:
    config = engine.config
    lengths = [len(ids) for ids in prompts]
    layout = cfg.policy.layout(max(lengths), cfg.max_new_tokens, engine.context_len)
    spec = BlobSpec.for_model(config, bytes(32), engine.dtype)  # the size ignores the fingerprint
    return {"path": engine.name, "params": sum(p.numel() for p in engine.model.parameters()),
            "num_layers": config.num_layers, "hidden_size": config.hidden_size,
            "num_kv_heads": config.num_kv_heads, "head_dim": config.head_dim,
            "context_len": engine.context_len, "prompt_tokens": (min(lengths), max(lengths)),
            "blob_bytes": spec.blob_size(layout), "torch_threads": torch.get_num_threads()}
