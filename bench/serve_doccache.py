"""`bench serve --workload doccache`: compress once, ask many, through the local cluster's
router (store, one prefill worker, one decode worker). A few documents, many questions each:
every request is a chat whose system message is its document, marked reusable
(``cache_prefix="system"``); the questions of all documents are interleaved, so the first
requests for one document arrive together (single flight). Per level: how each request's
document was had (stored, hit, bypass), the time to first token of misses and hits as the
client sees it, and the bytes the prefill worker holds in the store."""

from __future__ import annotations

import asyncio
import random
import time
import urllib.request
from dataclasses import asdict, dataclass, replace

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.report import markdown_table
from bench.serve_router import serving_cluster
from bench.serve_workload import ServeBenchConfig, run_level
from evaldata import PromptSpec, TaskConfig, generate
from snapstream.checkpoints import open_checkpoint
from snapstream.client import AsyncSnapstreamClient
from snapstream.policy import load_default_policy

CALL_TIMEOUT_S = 900.0
OUTCOMES = ("stored", "hit", "bypass")


@dataclass(frozen=True)
class Asked:
    """One request as the client saw it."""

    ttft_s: float
    outcome: str  # of OUTCOMES


def documents(cfg: ServeBenchConfig, model: str | None, count: int, level: int
              ) -> list[str]:
    """``count`` niah documents of ``cfg.prompt_len`` tokens, new ones for every level (so
    each level starts with misses)."""
    spec = PromptSpec(open_checkpoint(model).tokenizer(), "raw")
    return [generate("niah", random.Random(cfg.seed * 100_003 + level * 1_000 + i),
                     TaskConfig(context_len=cfg.prompt_len), spec).prompt
            for i in range(count)]


def interleaved(docs: list[str], questions: int) -> list[list[dict[str, str]]]:
    """Question j of every document before question j + 1 of any."""
    return [[{"role": "system", "content": doc},
             {"role": "user", "content": f"Question {j + 1}: what is the special magic "
                                         f"number for the key named in the text?"}]
            for j in range(questions) for doc in docs]


class DocCacheClient:
    def __init__(self, client: AsyncSnapstreamClient, cfg: ServeBenchConfig) -> None:
        policy = cfg.policy
        self.client = client
        self.options = dict(
            max_new_tokens=cfg.max_new_tokens, temperature=0.0, cache_prefix="system",
            policy=policy.kind, n_sink=policy.n_sink, n_topk=policy.n_topk,
            n_recent=policy.n_recent, observation=policy.observation, kernel=policy.kernel,
            pooling=policy.pooling)

    async def ask(self, messages: list[dict[str, str]]) -> Asked:
        sent = time.perf_counter()
        stream = self.client.chat_stream(messages, **self.options)
        first = None
        async for _ in stream:
            first = first or time.perf_counter()
        completion = await stream.result()
        return Asked((first or time.perf_counter()) - sent, completion.prefix_cache)


def held_bytes(metrics_url: str) -> float:
    """The prefill worker's ``snapstream_prefix_cache_bytes``."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    return next(sample.value for family in text_string_to_metric_families(text)
                for sample in family.samples if sample.name == "snapstream_prefix_cache_bytes")


def summarize(asked: list[Asked], wall_s: float, bytes_held: float) -> dict[str, float]:
    counts = {outcome: sum(a.outcome == outcome for a in asked) for outcome in OUTCOMES}
    stats: dict[str, float] = {"requests": len(asked), **counts, "wall_s": wall_s,
                               "hit_rate": counts["hit"] / len(asked), "bytes_held": bytes_held}
    for outcome in ("stored", "hit"):
        ttft = [a.ttft_s for a in asked if a.outcome == outcome]
        stats[f"ttft_p50_{outcome}_s"] = float(np.median(ttft)) if ttft else float("nan")
    return stats


def run_doccache_bench(cfg: ServeBenchConfig, model: str | None, num_documents: int
                       ) -> dict:
    """-> {"config", "documents", "levels": [{"concurrency", figures...}]}: at each level,
    ``num_documents`` new documents asked ``requests / num_documents`` questions each."""
    if cfg.policy is None:
        cfg = replace(cfg, policy=load_default_policy(open_checkpoint(model).policy_file))
    with serving_cluster(cfg, model) as cluster:
        levels = asyncio.run(_measure(cfg, model, cluster, num_documents))
    return {"config": asdict(cfg), "documents": num_documents, "levels": levels}


async def _measure(cfg: ServeBenchConfig, model: str | None, cluster, num_documents: int
                   ) -> list[dict]:
    metrics_url = cluster.metrics["prefill"]
    levels = []
    async with AsyncSnapstreamClient(cluster.endpoints["router"],
                                     timeout_s=CALL_TIMEOUT_S) as client:
        asker = DocCacheClient(client, cfg)
        for index, (concurrency, count) in enumerate(zip(cfg.concurrency, cfg.requests,
                                                         strict=True)):
            docs = documents(cfg, model, num_documents, index)
            prompts = interleaved(docs, max(1, count // num_documents))
            asked, wall_s = await run_level(asker.ask, prompts, concurrency,
                                            f"doccache c={concurrency}")
            bytes_held = await asyncio.to_thread(held_bytes, metrics_url)
            levels.append({"concurrency": concurrency,
                           **summarize(asked, wall_s, bytes_held)})
    return levels


def render(results: dict, command: str) -> str:
    rows = [[level["concurrency"], level["requests"], results["documents"], level["stored"],
             level["hit"], level["bypass"], f"{level['hit_rate']:.0%}",
             f"{level['ttft_p50_stored_s']:.2f}", f"{level['ttft_p50_hit_s']:.2f}",
             f"{level['ttft_p50_stored_s'] / level['ttft_p50_hit_s']:.1f}x",
             f"{level['bytes_held'] / 2**20:.1f}"]
            for level in results["levels"]]
    table = markdown_table(
        ["concurrency", "requests", "documents", "stored", "hit", "bypass", "hit rate",
         "TTFT p50 miss (s)", "TTFT p50 hit (s)", "miss / hit", "MiB held in the store"], rows)
    return f"```bash\n{command}\n```\n\n{table}\n"
