"""The serving benchmark's workload and statistics, shared by the router and the in-process runs:
prompts, a closed-loop driver at a fixed concurrency, and per-level latency figures."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from evaldata import PromptSpec, TaskConfig, generate
from snapstream.policy import CachePolicy
from snapstream.tokenizer import Tokenizer

PERCENTILES = (50, 90, 99)
# in-process: the engine and decode loop in this process; router: a local cluster through the
# gRPC client SDK; openai: an OpenAI-compatible server (the cluster's own, or openai_url)
SYSTEMS = ("in-process", "router", "openai")
DEFAULT_SYSTEMS = ("in-process", "router")


@dataclass(frozen=True)
class Slo:
    """A request is good when its time to first token and the p90 of its own inter-token gaps
    are both within these limits."""

    ttft_s: float = 2.0
    itl_p90_s: float = 0.25

    def __post_init__(self) -> None:
        if not self.ttft_s > 0 or not self.itl_p90_s > 0:
            raise ValueError(f"slo: ttft_s and itl_p90_s must be > 0, got {self.ttft_s} and "
                             f"{self.itl_p90_s}")


@dataclass(frozen=True)
class ServeBenchConfig:
    """``requests[i]`` requests are sent at ``concurrency[i]`` (closed loop: each of the
    ``concurrency`` clients sends its next request when its previous one has finished), by each
    of ``systems`` in each of ``rounds`` rounds. ``openai_url`` (``http://HOST:PORT/v1``) is
    the server the openai system drives; None: the local cluster's router. ``openai_fields``:
    top-level request fields that server takes besides OpenAI's (llama-server's
    ``cache_prompt``), as (name, value) pairs."""

    concurrency: tuple[int, ...] = (1, 8, 32)
    requests: tuple[int, ...] = (16, 32, 64)
    prompt_len: int = 1500  # tokens of the passkey prompt
    max_new_tokens: int = 64
    policy: CachePolicy | None = None  # None: the model's default policy, as served
    rows: int = 32  # of the one decode worker, and of the in-process decode loop
    store: str = "redis"
    torch_threads: int = 0  # of the in-process engine and of each cluster worker; 0: default
    rounds: int = 2
    warmup: int = 2  # requests per system before measuring, not recorded
    slo: Slo = field(default_factory=Slo)
    seed: int = 0
    systems: tuple[str, ...] = DEFAULT_SYSTEMS
    openai_url: str | None = None
    openai_fields: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if len(self.concurrency) != len(self.requests):
            raise ValueError(f"requests must give one count per concurrency level "
                             f"{self.concurrency}, got {self.requests}")
        if min(self.concurrency, default=0) < 1 or min(self.requests, default=0) < 1:
            raise ValueError("concurrency and requests must be >= 1")
        for name in ("max_new_tokens", "rows", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        unknown = [name for name in self.systems if name not in SYSTEMS]
        if unknown or not self.systems or len(set(self.systems)) != len(self.systems):
            raise ValueError(f"systems: name each of {', '.join(SYSTEMS)} at most once, got "
                             f"{','.join(self.systems)}")
        if self.openai_url is not None and "openai" not in self.systems:
            raise ValueError("openai_url is the server of the openai system: add openai to "
                             "systems")

    @property
    def max_queue(self) -> int:
        """Queue bound of every worker: no request is ever turned away."""
        return max(64, 2 * max(self.concurrency))


@dataclass(frozen=True)
class RequestTrace:
    """One request as its caller saw it: when it was sent, and when each token arrived."""

    sent: float
    arrivals: tuple[float, ...]
    token_ids: tuple[int, ...]

    @property
    def ttft_s(self) -> float:
        return self.arrivals[0] - self.sent

    @property
    def gaps_s(self) -> np.ndarray:
        return np.diff(np.asarray(self.arrivals))

    def meets(self, slo: Slo) -> bool:
        gaps = self.gaps_s
        return self.ttft_s <= slo.ttft_s and (
            gaps.size == 0 or float(np.percentile(gaps, 90)) <= slo.itl_p90_s)


Generate = Callable[[list[int]], Awaitable[RequestTrace]]


def make_prompts(cfg: ServeBenchConfig, tokenizer: Tokenizer, count: int) -> list[list[int]]:
    """Passkey retrieval prompts of ``cfg.prompt_len`` tokens, needles at varied depths."""
    spec = PromptSpec(tokenizer)
    return [tokenizer.encode(generate("passkey", random.Random(cfg.seed * 100_003 + i),
                                      TaskConfig(context_len=cfg.prompt_len,
                                                 depth=(i % 11) / 10), spec).prompt)
            for i in range(count)]


async def run_level(generate_fn: Generate, prompts: list[list[int]], concurrency: int,
                    desc: str) -> tuple[list[RequestTrace], float]:
    """Sends every prompt with ``concurrency`` requests in flight; -> traces in prompt order
    and the wall time from the first send to the last token."""
    traces: list[RequestTrace | None] = [None] * len(prompts)
    pending = iter(enumerate(prompts))
    with tqdm(total=len(prompts), desc=desc, unit="req", leave=False) as progress:

        async def client() -> None:
            for index, ids in pending:  # the iterator is shared: each prompt is sent once
                traces[index] = await generate_fn(ids)
                progress.update()

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall_s = time.perf_counter() - start
    return traces, wall_s


def summarize(traces: list[RequestTrace], wall_s: float, slo: Slo) -> dict[str, float]:
    """Percentiles of TTFT (over requests) and ITL (over every gap of every stream, 0 between
    tokens that arrive together), token throughput, tokens per arrival, and goodput (requests
    meeting the SLO per second)."""
    ttft = np.array([t.ttft_s for t in traces])
    gaps = np.concatenate([t.gaps_s for t in traces])
    tokens = sum(len(t.arrivals) for t in traces)  # a server that names no ids: 1 per event
    good = sum(t.meets(slo) for t in traces)
    chunks = sum(len(set(t.arrivals)) for t in traces)  # tokens that arrive together: 1 chunk
    stats = {"requests": len(traces), "tokens": tokens, "tokens_per_chunk": tokens / chunks,
             "wall_s": wall_s,
             "throughput_tok_s": tokens / wall_s, "goodput_req_s": good / wall_s,
             "slo_met": good / len(traces)}
    for p in PERCENTILES:
        stats[f"ttft_p{p}_s"] = float(np.percentile(ttft, p))
        stats[f"itl_p{p}_s"] = float(np.percentile(gaps, p)) if gaps.size else float("nan")
    return stats
