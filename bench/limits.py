"""The machine's limits, measured in the benchmark's own run, and a figure as a share of them:
a decode step's bytes against the memory bandwidth, a prefill's FLOPs against the bfloat16
GEMM peak.

A prompt's FLOPs (:func:`prompt_flops`, for comparing systems): 2 per weight of the layers'
projections per token, and 4 * head_dim per query head per (query, key) pair attended (causal,
at most a sliding layer's window), the LM head once.

A decode step reads at least every weight once (as the engine holds them: int4/int8 codes and
scales, norms; a tied LM head and embedding once) and every row's K and V over the layout's
slots (``kvcache.pool_row_bytes``); the bandwidth is the best of a few ``torch.sum`` over a
float32 tensor far larger than the last-level cache. The GEMM peak is the best of a few plain
``torch.mm`` at shapes of the prompt's projections.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from snapstream.config import ModelConfig
from snapstream.kvcache import kv_bytes_per_token

GEMM_SHAPES = ((2048, 576, 1536), (4096, 1536, 576), (8192, 576, 3072))  # (M, K, N)
GEMM_DTYPES = (torch.float32, torch.bfloat16)
BANDWIDTH_BYTES = 2**30  # far beyond any last-level cache


def gemm_peak(shapes=GEMM_SHAPES, calls: int = 5) -> dict[str, dict[str, float]]:
    """GFLOP/s of a plain ``torch.mm`` per shape and dtype (best of ``calls``)."""
    out = {}
    for m, k, n in shapes:
        for dtype in GEMM_DTYPES:
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            torch.mm(a, b)
            best = min(_timed(lambda a=a, b=b: torch.mm(a, b)) for _ in range(calls))
            out.setdefault(f"{m}x{k}x{n}", {})[str(dtype).removeprefix("torch.")] = (
                2 * m * k * n / best / 1e9)
    return out


def memory_bandwidth(nbytes: int = BANDWIDTH_BYTES, calls: int = 5) -> float:
    """GB/s (10^9 bytes) of reading ``nbytes`` once: the best of ``calls`` ``torch.sum``."""
    x = torch.ones(nbytes // 4, dtype=torch.float32)
    x.sum()
    best = min(_timed(x.sum) for _ in range(calls))
    return nbytes / best / 1e9


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def attended_pairs(prompt_len: int, window: int | None) -> int:
    """(query, key) pairs of causal attention over ``prompt_len`` tokens, at most ``window``
    keys per query."""
    full = prompt_len * (prompt_len + 1) // 2
    if window is None or window >= prompt_len:
        return full
    return full - (prompt_len - window) * (prompt_len - window + 1) // 2


def prompt_flops(config: ModelConfig, prompt_len: int) -> float:
    """The model's work on a prompt of ``prompt_len`` tokens, every token through every layer
    (what any system computes, whatever it skips on top)."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    per_layer = (config.hidden_size * (2 * q + 2 * kv)  # q, k, v, o
                 + 3 * config.hidden_size * config.intermediate_size)  # gate, up, down
    linear = 2.0 * per_layer * config.num_layers * prompt_len
    pairs = sum(attended_pairs(prompt_len, window) for window in config.attention_windows)
    head = 2.0 * config.hidden_size * config.vocab_size
    return linear + 4.0 * config.head_dim * config.num_heads * pairs + head


def context_kv_bytes(config: ModelConfig, tokens: int) -> int:
    """K and V in float16 of ``tokens`` tokens of context, each layer at most its window: what
    a full cache holds (and a decode step reads) for a sequence that long."""
    per_layer_token = kv_bytes_per_token(config, torch.float16) // config.num_layers
    return sum(per_layer_token * min(tokens, window or tokens)
               for window in config.attention_windows)


def model_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters and buffers, each tensor once (a tied head counted once)."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.nbytes for t in tensors.values())


def decode_step_bytes(weights: int, row_bytes: int, batch: int) -> int:
    """What a decode step of ``batch`` rows reads at least: the weights once, every row's KV."""
    return weights + batch * row_bytes


def share_of_limit(seconds: float, work: float, limit_per_s: float) -> float:
    """The fraction of a limit a figure reaches: ``work`` (bytes or FLOPs) done in ``seconds``
    against ``limit_per_s`` (the same unit per second)."""
    return work / seconds / limit_per_s
