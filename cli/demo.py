"""The README's demo: a question about a long real document, answered through the cluster with
the model's default cache policy scaled to a quarter of the prompt.

The document is the documentation of a standard-library module (every public function's and
method's docstring, in source order), which every Python has offline. One sentence is planted
in its middle and the question at the end asks for it, so the answer sits mid-document: a
cache that keeps only the recent tokens (StreamingLLM) loses it.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from snapstream.checkpoints import Checkpoint, open_checkpoint
from snapstream.client import SnapstreamClient
from snapstream.weight_formats import AUTO, kv_dtype_name, weight_format

MODULE = "statistics"
FACT = "The statistics module was reviewed by the team in room 5820."
QUESTION = "In which room did the team review the statistics module? The team reviewed it in room"
ANSWER = "5820"
BUDGET_FRACTION = 4  # the cache keeps at most 1/4 of the prompt's tokens
DECODE_TOKENS = 64  # the answer is the first line; the rest measures the decode rate


def documentation(module_name: str) -> str:
    """The module's docstring, then each public function, class and method with its signature
    and docstring, in definition order."""
    module = importlib.import_module(module_name)
    parts = [f"Documentation of the Python module {module_name}", inspect.getdoc(module) or ""]
    for name, member in vars(module).items():
        if name.startswith("_") or getattr(member, "__module__", None) != module_name:
            continue
        if inspect.isfunction(member) or inspect.isclass(member):
            parts += _documented(name, member)
        if inspect.isclass(member):
            parts += [text for method, fn in vars(member).items()
                      if not method.startswith("_") and inspect.isfunction(fn)
                      for text in _documented(f"{name}.{method}", fn)]
    return "\n\n".join(parts)


def _documented(name: str, member: object) -> list[str]:
    doc = inspect.getdoc(member)
    if not doc:
        return []
    try:
        signature = str(inspect.signature(member))
    except (TypeError, ValueError):
        signature = "(...)"
    return [f"{name}{signature}\n{doc}"]


def demo_prompt() -> str:
    """The document with :data:`FACT` between its middle paragraphs, then the question."""
    paragraphs = documentation(MODULE).split("\n\n")
    middle = len(paragraphs) // 2
    return "\n\n".join([*paragraphs[:middle], FACT, *paragraphs[middle:], QUESTION])


@dataclass(frozen=True)
class DemoReport:
    answer: str
    is_correct: bool
    prompt_tokens: int
    policy: str  # the layout asked for, e.g. "snapstream 0 + 931 + 310"
    kept_tokens: int
    kv_dtype: str  # what the served KV cache holds (bfloat16, int8, ...)
    kv_bytes_kept: int  # the compressed cache as served (its blob: K/V in the served dtype)
    kv_bytes_full: int  # the same per token, for every prompt token
    ttft_s: float
    decode_tokens: int
    decode_s: float

    def lines(self) -> list[str]:
        mib = 2**20
        return [
            f"answer: {self.answer!r} (expected {ANSWER!r}: "
            f"{'correct' if self.is_correct else 'wrong'})",
            f"prompt: {self.prompt_tokens} tokens; KV cache kept: {self.kept_tokens} tokens per "
            f"layer and head ({self.kept_tokens / self.prompt_tokens:.0%} of the prompt; the "
            f"model's default policy at a quarter of the prompt: {self.policy})",
            f"KV bytes as served (the blob: K/V in {self.kv_dtype} + a position per slot): "
            f"{self.kv_bytes_kept / mib:.1f} MiB kept vs {self.kv_bytes_full / mib:.1f} MiB "
            f"for the full cache in {self.kv_dtype} "
            f"({self.kv_bytes_full / self.kv_bytes_kept:.1f}x smaller)",
            f"time to first token: {self.ttft_s:.2f} s; decode: "
            f"{self.decode_tokens / max(self.decode_s, 1e-9):.1f} tokens/s over "
            f"{self.decode_tokens} tokens",
        ]


def served_kv_dtype(checkpoint: Checkpoint, kv_dtype: str | None) -> str:
    """The KV dtype the workers serve ``checkpoint`` with: ``kv_dtype`` (their --kv-dtype),
    or when None the one of the checkpoint's own weight format (bfloat16 for a GGUF)."""
    return kv_dtype_name(kv_dtype, weight_format(AUTO, checkpoint.native_format))


def run_demo(router_address: str, model: str | None, kv_dtype: str | None,
             timeout_s: float) -> DemoReport:
    """Sends the demo request through the router and measures it. ``model``: the served
    checkpoint, read here (torch-free) for the prompt's length in tokens; ``kv_dtype``: the
    workers' ``--kv-dtype`` (None: the checkpoint's format's own)."""
    prompt = demo_prompt()
    checkpoint = open_checkpoint(model)
    kv_dtype = served_kv_dtype(checkpoint, kv_dtype)
    budget = len(checkpoint.tokenizer().encode(prompt)) // BUDGET_FRACTION
    with SnapstreamClient(router_address, timeout_s=timeout_s) as client:
        default = client.info().default_policy
        n_recent = max(1, round(budget * default.n_recent / default.budget))
        sizes = {"n_sink": default.n_sink, "n_topk": budget - default.n_sink - n_recent,
                 "n_recent": n_recent}
        completion = client.generate(prompt, max_new_tokens=DECODE_TOKENS, temperature=0.0,
                                     policy=default.kind, **sizes)
    answer = completion.text.strip().split("\n")[0]
    # the blob's slots over every layer: the global layers' count, a sliding layer's window
    windows = checkpoint.config.attention_windows
    layer_slots = sum(completion.kv_cache_slots if w is None else w for w in windows)
    per_token = completion.kv_cache_bytes / layer_slots * len(windows)
    return DemoReport(
        answer=answer, is_correct=answer.startswith(ANSWER),
        prompt_tokens=completion.prompt_tokens,
        policy=f"{default.kind} {' + '.join(str(size) for size in sizes.values())}",
        kept_tokens=completion.kv_cache_slots, kv_dtype=kv_dtype,
        kv_bytes_kept=completion.kv_cache_bytes,
        kv_bytes_full=round(completion.prompt_tokens * per_token),
        ttft_s=completion.time_to_first_token_s,
        decode_tokens=max(completion.completion_tokens - 1, 0),
        decode_s=completion.decode_time_s)
