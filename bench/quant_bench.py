"""Weight formats side by side on the served model: decode step time at batch 1 and 16, prefill
speed, peak RSS, and greedy parity against float32 (chat prompts, passkey/needle retrieval).

Timings step every (format, torch threads) pair round-robin in one process, so that load from
other processes falls on all of them alike; RSS comes from one fresh process per format.
Run: ``python -m bench.quant_bench`` (or ``snapstream bench quant``).
"""

from __future__ import annotations

import json
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.engine_bench import ours_stepper
from evaldata import PromptSpec, TaskConfig, exact_match, generate
from snapstream.chat import ChatMessage
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.sampling_params import SamplingParams
from snapstream.weight_formats import WEIGHT_FORMATS

CHAT_PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "Explain what a hash table is to a beginner.",
    "Give me three tips for sleeping better.",
    "Translate 'good morning, how are you?' into Spanish.",
    "What is 17 times 23? Show your steps.",
    "Write a Python function that reverses a string.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
)


@dataclass(frozen=True)
class DecodeSpec:
    batch: int
    context: int
    cache: str  # "model": the model's default policy (fixed-size); "full": every token


@dataclass(frozen=True)
class QuantBenchConfig:
    formats: tuple[str, ...] = ("float32", "gguf", "int8", "int4")
    threads: tuple[int, ...] = (1, 2)
    decode: tuple[DecodeSpec, ...] = (DecodeSpec(1, 1024, "model"), DecodeSpec(16, 1024, "model"),
                                      DecodeSpec(1, 8192, "full"))
    steps: int = 20
    warmup: int = 3
    prefill_len: int = 1024
    prefill_rounds: int = 5
    parity_tokens: int = 32
    retrieval_len: int = 2000
    retrieval_tasks: tuple[str, ...] = ("passkey", "niah")
    retrieval_depths: tuple[float, ...] = (0.2, 0.5, 0.8)
    seed: int = 0


def interleaved(steppers: dict[tuple[str, int], Callable[[int], object]], steps: int,
                warmup: int) -> dict[tuple[str, int], float]:
    """Median seconds per call of each (format, threads) stepper, called round-robin."""
    times: dict[tuple[str, int], list[float]] = {key: [] for key in steppers}
    before = torch.get_num_threads()
    try:
        for i in range(warmup + steps):
            for (fmt, threads), step in steppers.items():
                torch.set_num_threads(threads)
                start = time.perf_counter()
                step(i)
                if i >= warmup:
                    times[fmt, threads].append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return {key: statistics.median(values) for key, values in times.items()}


def decode_figures(engines: dict[str, Engine], cfg: QuantBenchConfig) -> list[dict]:
    rows = []
    for spec in cfg.decode:
        steppers = {}
        for fmt, engine in engines.items():
            policy = engine.default_policy if spec.cache == "model" else CachePolicy(kind="full")
            layout = policy.layout(spec.context, cfg.warmup + cfg.steps)
            stepper = ours_stepper(engine.model, layout, spec.batch, spec.context,
                                   dtype=engine.kv_dtype)
            steppers.update({(fmt, t): stepper for t in cfg.threads})
        medians = interleaved(steppers, cfg.steps, cfg.warmup)
        for (fmt, threads), seconds in medians.items():
            rows.append({**asdict(spec), "format": fmt, "threads": threads, "step_s": seconds})
        del steppers
    return rows


def prefill_figures(engines: dict[str, Engine], cfg: QuantBenchConfig) -> list[dict]:
    ids = torch.randint(0, next(iter(engines.values())).config.vocab_size, (cfg.prefill_len,),
                        generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    steppers = {(fmt, t): (lambda i, e=engine: e.prefill(ids, e.default_policy, 1))
                for fmt, engine in engines.items() for t in cfg.threads}
    medians = interleaved(steppers, cfg.prefill_rounds, 1)
    return [{"format": fmt, "threads": threads, "prefill_s": seconds,
             "tokens_per_s": cfg.prefill_len / seconds}
            for (fmt, threads), seconds in medians.items()]


def greedy(engine: Engine, prompt: str | list[int], tokens: int) -> list[int]:
    return engine.generate(prompt, max_new_tokens=tokens,
                           sampling=SamplingParams(ignore_eos=True)).token_ids


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a),
                                                                                     len(b)))


def forced_logits(engine: Engine, ids: list[int]) -> torch.Tensor:
    """Next-token logits (P, V) at every position of ``ids``, full causal attention."""
    hidden = engine.model(torch.tensor([ids]), torch.arange(len(ids))[None],
                          engine.model.causal_attend)
    return engine.model.logits(hidden[0])  # (P, V)


def parity_figures(engines: dict[str, Engine], cfg: QuantBenchConfig) -> dict[str, dict]:
    """Chat prompts: 32 greedy tokens, identical to float32's or the first differing index;
    retrieval prompts (compressed by the model's policy): the answer found or not; the first
    two retrieval prompts teacher-forced: top-1 agreement with float32 and KL(fp32 || format)
    of the next-token distributions, averaged over positions."""
    tokenizer = next(iter(engines.values())).tokenizer
    chats = [tokenizer.render_chat([ChatMessage("user", text)]) for text in CHAT_PROMPTS]
    spec = PromptSpec(tokenizer)
    samples = [generate(task, random.Random(cfg.seed * 100_003 + i),
                        TaskConfig(context_len=cfg.retrieval_len, depth=depth), spec)
               for task in cfg.retrieval_tasks
               for i, depth in enumerate(cfg.retrieval_depths)]
    out = {}
    for fmt, engine in engines.items():
        outputs = [greedy(engine, chat, cfg.parity_tokens) for chat in chats]
        found = [exact_match(s.answers, engine.generate(s.prompt, 12).text) for s in samples]
        out[fmt] = {"chat_outputs": outputs, "retrieval_found": found,
                    "chat_texts": [tokenizer.decode(ids) for ids in outputs]}
    forced_ids = [tokenizer.encode(s.prompt) for s in samples[:2]]
    ref_logits = [forced_logits(engines[cfg.formats[0]], ids) for ids in forced_ids]
    for fmt, engine in engines.items():
        pairs = [(forced_logits(engine, ids), ref) for ids, ref in zip(forced_ids, ref_logits,
                                                                      strict=True)]
        out[fmt]["forced_top1"] = sum(float((a.argmax(-1) == b.argmax(-1)).float().mean())
                                      for a, b in pairs) / len(pairs)
        out[fmt]["forced_kl"] = sum(float(F.kl_div(a.log_softmax(-1), b.log_softmax(-1),
                                                   log_target=True, reduction="batchmean"))
                                    for a, b in pairs) / len(pairs)
    reference = out[cfg.formats[0]]["chat_outputs"]
    for figures in out.values():
        figures["first_diff"] = [common_prefix(a, b) for a, b in
                                 zip(figures["chat_outputs"], reference, strict=True)]
        figures["identical"] = sum(a == b for a, b in zip(figures["chat_outputs"], reference,
                                                          strict=True))
    return out


def rss_figures(fmt: str, path: str | None, prefill_len: int) -> dict[str, float]:
    """Load ``fmt``, prefill ``prefill_len`` tokens and decode 16: peak and final RSS (MiB)."""
    torch.set_grad_enabled(False)
    engine = Engine.from_pretrained(path, dtype=fmt)
    loaded = _vm_rss_mib()
    ids = list(range(100, 100 + prefill_len))
    engine.generate(ids, max_new_tokens=16, sampling=SamplingParams(ignore_eos=True))
    return {"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "loaded_mib": loaded, "final_mib": _vm_rss_mib()}


def _vm_rss_mib() -> float:
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


def rss_in_subprocess(fmt: str, path: str | None, prefill_len: int) -> dict[str, float]:
    code = ("import json, sys; from bench.quant_bench import rss_figures; "
            "print(json.dumps(rss_figures(sys.argv[1], sys.argv[2] or None, int(sys.argv[3]))))")
    done = subprocess.run([sys.executable, "-c", code, fmt, path or "", str(prefill_len)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_quant_bench(cfg: QuantBenchConfig, path: str | None) -> dict:
    torch.set_grad_enabled(False)
    unknown = set(cfg.formats) - set(WEIGHT_FORMATS)
    if unknown:
        raise ValueError(f"formats {sorted(unknown)} unknown: choose among "
                         f"{sorted(WEIGHT_FORMATS)}")
    rss = {fmt: rss_in_subprocess(fmt, path, cfg.prefill_len) for fmt in cfg.formats}
    engines = {fmt: Engine.from_pretrained(path, dtype=fmt) for fmt in cfg.formats}
    load = _loadavg()
    results = {"config": asdict(cfg), "model": engines[cfg.formats[0]].name, "rss": rss,
               "decode": decode_figures(engines, cfg),
               "prefill": prefill_figures(engines, cfg)}
    default_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads[0])
    results["parity"] = parity_figures(engines, cfg)
    torch.set_num_threads(default_threads)
    results["loadavg"] = [load, _loadavg()]
    return results


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
