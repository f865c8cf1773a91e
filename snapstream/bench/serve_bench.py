"""`bench serve`, serving part: the same prompts at each concurrency through the router (a local
cluster) and through the in-process engine; latency, throughput, goodput and where time goes."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path

import torch

from kvstore.codec import BlobSpec
from snapstream.bench.serve_inprocess import InProcessServer
from snapstream.bench.serve_profile import difference, take_snapshot
from snapstream.bench.serve_router import RouterClient, serving_cluster
from snapstream.bench.serve_workload import (
    Generate,
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


def run_serve_bench(cfg: ServeBenchConfig, model_dir: Path) -> dict:
    """-> {"config", "model", "levels": [{"concurrency", "in-process", "router",
    "identical_outputs"}]}, each system's figures with the "profile" of its run; at each level
    the in-process run goes first, then the router's."""
    engine = Engine.from_pretrained(model_dir)
    prompts = make_prompts(cfg, engine.tokenizer, cfg.warmup + max(cfg.requests))
    server = InProcessServer(engine, model_dir, cfg)
    try:
        with serving_cluster(cfg, model_dir) as cluster:
            levels = asyncio.run(_measure(cfg, server, cluster, prompts))
    finally:
        server.close()
    return {"config": asdict(cfg), "model": _describe(engine, model_dir, cfg, prompts),
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
        levels = []
        for concurrency, count in zip(cfg.concurrency, cfg.requests, strict=True):
            level: dict = {"concurrency": concurrency}
            outputs = {}
            for name, generate in systems.items():
                before = await asyncio.to_thread(take_snapshot, cluster.metrics, cluster.pids)
                traces, wall_s = await run_level(generate, measured[:count], concurrency,
                                                 f"{name} c={concurrency}")
                after = await asyncio.to_thread(take_snapshot, cluster.metrics, cluster.pids)
                level[name] = {**summarize(traces, wall_s, cfg.slo),
                               "profile": difference(before, after)}
                outputs[name] = [trace.token_ids for trace in traces]
            level["identical_outputs"] = sum(
                a == b for a, b in zip(*outputs.values(), strict=True))
            levels.append(level)
    return levels


def _describe(engine: Engine, model_dir: Path, cfg: ServeBenchConfig,
              prompts: list[list[int]]) -> dict:
    config = engine.config
    lengths = [len(ids) for ids in prompts]
    layout = cfg.policy.layout(max(lengths), cfg.max_new_tokens, engine.context_len)
    spec = BlobSpec.for_model(config, bytes(32), engine.dtype)  # the size ignores the fingerprint
    return {"path": str(model_dir), "params": sum(p.numel() for p in engine.model.parameters()),
            "num_layers": config.num_layers, "hidden_size": config.hidden_size,
            "num_kv_heads": config.num_kv_heads, "head_dim": config.head_dim,
            "context_len": engine.context_len, "prompt_tokens": (min(lengths), max(lengths)),
            "blob_bytes": spec.blob_size(layout), "torch_threads": torch.get_num_threads()}
