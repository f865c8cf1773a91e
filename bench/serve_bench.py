"""`bench serve`, serving part: the same prompts at each concurrency through each system (the
in-process engine, the router of a local cluster over gRPC, an OpenAI-compatible server);
latency, throughput, goodput and where time goes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, replace

import openai
import torch

from bench.limits import model_bytes
from bench.serve_inprocess import InProcessServer
from bench.serve_openai import API_KEY, OpenAIClient, served_model
from bench.serve_profile import Usage, usage_now
from bench.serve_router import RouterClient, serving_cluster
from bench.serve_workload import (
    Generate,
    RequestTrace,
    ServeBenchConfig,
    make_prompts,
    run_level,
    summarize,
)
from cluster import LocalCluster
from kvstore.codec import BlobSpec
from snapstream.client import AsyncSnapstreamClient
from snapstream.engine import Engine

CALL_TIMEOUT_S = 600.0
ROUND_FIGURES = ("ttft_p50_s", "itl_p50_s", "throughput_tok_s")  # kept per round, for the spread


@dataclass(frozen=True)
class Setting:
    """What every system is made from."""

    cfg: ServeBenchConfig
    engine: Engine
    cluster: LocalCluster


@contextlib.asynccontextmanager
async def _in_process(setting: Setting) -> AsyncIterator[Generate]:
    server = InProcessServer(setting.engine, setting.cfg)
    try:
        yield server.generate
    finally:
        server.close()


@contextlib.asynccontextmanager
async def _router(setting: Setting) -> AsyncIterator[Generate]:
    async with AsyncSnapstreamClient(setting.cluster.endpoints["router"],
                                     timeout_s=CALL_TIMEOUT_S) as client:
        yield RouterClient(client, setting.cfg).generate


@contextlib.asynccontextmanager
async def _openai(setting: Setting) -> AsyncIterator[Generate]:
    url = setting.cfg.openai_url or setting.cluster.openai_url
    async with openai.AsyncOpenAI(base_url=url, api_key=API_KEY, timeout=CALL_TIMEOUT_S,
                                  max_retries=0) as client:
        yield OpenAIClient(client, await served_model(client), setting.cfg).generate


SYSTEM_FACTORIES: dict[str, Callable[[Setting], AbstractAsyncContextManager[Generate]]] = {
    "in-process": _in_process, "router": _router, "openai": _openai}


def run_serve_bench(cfg: ServeBenchConfig, model: str | None) -> dict:
    """-> {"config", "model", "levels": [{"concurrency", SYSTEM..., "identical_outputs",
    "rounds"}]}, each system's figures with the "profile" of its runs."""
    if cfg.torch_threads:  # the in-process engine gets what each cluster worker gets
        torch.set_num_threads(cfg.torch_threads)
    engine = Engine.from_pretrained(model)
    cfg = replace(cfg, policy=cfg.policy or engine.default_policy)
    prompts = make_prompts(cfg, engine.tokenizer, cfg.warmup + max(cfg.requests))
    with serving_cluster(cfg, model) as cluster:
        levels = asyncio.run(_measure(Setting(cfg, engine, cluster), prompts))
    return {"config": asdict(cfg), "model": _describe(engine, cfg, prompts),
            "levels": levels}


async def _measure(setting: Setting, prompts: list[list[int]]) -> list[dict]:
    cfg, cluster = setting.cfg, setting.cluster
    warm, measured = prompts[:cfg.warmup], prompts[cfg.warmup:]
    async with contextlib.AsyncExitStack() as stack:
        systems: dict[str, Generate] = {
            name: await stack.enter_async_context(SYSTEM_FACTORIES[name](setting))
            for name in cfg.systems}
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
    level["identical_outputs"] = sum(  # prompts whose tokens every system agrees on
        len({trace.token_ids for trace in same}) == 1
        for same in zip(*traces.values(), strict=True))
    return level


def _describe(engine: Engine, cfg: ServeBenchConfig,
              prompts: list[list[int]]) -> dict:
    config = engine.config
    lengths = [len(ids) for ids in prompts]
    layout = cfg.policy.layout(max(lengths), cfg.max_new_tokens, engine.context_len)
    spec = BlobSpec.for_model(config, bytes(32), engine.kv_dtype)  # size ignores the fingerprint
    return {"path": engine.name, "weight_bytes": model_bytes(engine.model),
            "num_layers": config.num_layers, "hidden_size": config.hidden_size,
            "num_kv_heads": config.num_kv_heads, "head_dim": config.head_dim,
            "context_len": engine.context_len, "prompt_tokens": (min(lengths), max(lengths)),
            "blob_bytes": spec.blob_size(spec.model_layout(layout)),
            "dtype": _name(engine.dtype), "prefill_dtype": _name(engine.prefill_dtype),
            "kv_dtype": _name(engine.kv_dtype),
            "torch_threads": torch.get_num_threads()}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
