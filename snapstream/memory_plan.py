"""A model worker's memory by component, in bytes, and what it admits within its limit.

- weights: the model's parameters and buffers as loaded, each tensor once (a tied head once);
- GEMM weights: the quantized layers' dequantized copies that a prompt's GEMMs read
  (``QuantizedLinear.gemm_weight``, in the CPU's GEMM dtype: float32 where the CPU has no
  bfloat16 instructions), made by the prefill worker's warm-up; the LM head never makes one (a
  prompt's logits are its last row), nor does a decode worker;
- prefill activations: what one prompt's forward holds at its peak, from the model's shape
  (:func:`prefill_activation_bytes`);
- decode pools: rows x a layout's K/V (``kvcache.pool_row_bytes``), made when a request of a
  new layout arrives (:class:`DecodeMemory`).

A worker's limit (:func:`memory_limit`) is what it may hold in all: ``--memory-limit`` where
given, else its cgroup's limit, else what the machine had available when the worker started
plus what the worker held then. Work that would pass it is refused with
:class:`MemoryExhausted` (gRPC RESOURCE_EXHAUSTED with a retry hint, HTTP 429) before it
allocates anything, never by the kernel's out-of-memory killer.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from snapstream.config import ModelConfig
from snapstream.engine import Engine
from snapstream.memory import MemoryExhausted
from snapstream.model import MLP_CHUNK_ROWS, Transformer
from snapstream.quant import QuantizedLinear

GIB = 1 << 30
# The prompt forward's live tensors at a layer's peak, in activations per prompt token: the
# residual stream twice (the layer's input and its sum with attention), the normed input, the
# QKV projection, the rotated queries and keys, attention's output and its projection
# (RESIDUAL_COPIES hidden-wide, QUERY_COPIES query-wide, KV_COPIES key/value-wide), and the
# layer's whole K and V in float32 until the recorder has compressed them.
RESIDUAL_COPIES, QUERY_COPIES, KV_COPIES = 4, 3, 5
# what the measured peaks hold beyond the formula (allocator slack, SnapKV's scores): a share
HEADROOM = 0.25
_SIZE = re.compile(r"(?i)^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'8GiB', '512M', '1.5G', '4096' -> bytes (K/M/G/T are powers of 1024)."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"memory limit: want a size such as 8GiB, 512MiB or 4096 (bytes), "
                         f"got {text!r}")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "").upper()[:1]])


def held_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers, each tensor once (a tied head once)."""
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return sum(t.nbytes for t in tensors.values())


def gemm_weight_bytes(model: Transformer, dtype: torch.dtype) -> int:
    """Bytes of the GEMM weights a prompt makes: every quantized layer of the decoder layers,
    dequantized to ``dtype`` (the LM head and a quantized embedding table make none)."""
    return sum(layer.out_features * layer.in_features * dtype.itemsize
               for layer in model.model.layers.modules() if isinstance(layer, QuantizedLinear))


def prefill_activation_bytes(config: ModelConfig, tokens: int, dtype: torch.dtype) -> int:
    """What one prompt of ``tokens`` holds at its forward's peak in activations of ``dtype``
    (see the module docstring), with ``HEADROOM``; the MLP runs at most MLP_CHUNK_ROWS rows at
    a time, so its intermediate is bounded."""
    query, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    per_token = (RESIDUAL_COPIES * config.hidden_size + QUERY_COPIES * query) * dtype.itemsize \
        + KV_COPIES * kv * 4
    mlp_rows = min(tokens, MLP_CHUNK_ROWS)
    mlp = mlp_rows * (3 * config.intermediate_size + config.hidden_size) * dtype.itemsize
    return int((tokens * per_token + mlp) * (1 + HEADROOM))


def resident_bytes() -> int:
    """This process's resident memory now."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 memory.max or v1 limit_in_bytes), None
    when it has none."""
    for path in (Path("/sys/fs/cgroup/memory.max"),
                 Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):  # v1 says "no limit" with a huge number
            return int(text)
    return None


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise ValueError("/proc/meminfo has no MemAvailable: give --memory-limit")


def memory_limit(given: str | None) -> int:
    """The bytes this worker may hold in all (see the module docstring); called once, when the
    worker starts."""
    if given:
        return parse_size(given)
    return _cgroup_limit() or _available_bytes() + resident_bytes()


@dataclass(frozen=True)
class PrefillMemory:
    """A prefill worker's memory: what it holds once warm, the prompt activations' model, its
    limit, and so the longest prompt it admits."""

    config: ModelConfig
    dtype: torch.dtype  # the prompt forward's activations
    limit: int
    weights: int
    gemm_weights: int
    held: int  # resident once warm: weights, GEMM weights, tokenizer, the runtime

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt whose activations fit beside what the worker holds (0: none)."""
        free = self.limit - self.held
        low, high = 0, self.config.max_position_embeddings
        while low < high:  # the activations grow with the prompt: the largest that fits
            mid = (low + high + 1) // 2
            if prefill_activation_bytes(self.config, mid, self.dtype) <= free:
                low = mid
            else:
                high = mid - 1
        return low

    def check_prompt(self, tokens: int) -> None:
        """MemoryExhausted when a prompt of ``tokens`` would not fit (before it runs)."""
        if tokens > self.max_prompt_tokens:
            need = prefill_activation_bytes(self.config, tokens, self.dtype)
            raise MemoryExhausted(
                f"a prompt of {tokens} tokens needs {need / GIB:.2f} GiB of prefill activations "
                f"beside the {self.held / GIB:.2f} GiB this worker holds, over its memory limit "
                f"of {self.limit / GIB:.2f} GiB (it admits prompts up to "
                f"{self.max_prompt_tokens} tokens): retry on a worker with more memory, or "
                "shorten the prompt")

    def report(self) -> dict[str, int]:
        """Bytes by component (the prompt activations at the longest prompt admitted)."""
        return {"limit": self.limit, "weights": self.weights, "gemm_weights": self.gemm_weights,
                "held": self.held, "activations_at_max_prompt": prefill_activation_bytes(
                    self.config, self.max_prompt_tokens, self.dtype),
                "max_prompt_tokens": self.max_prompt_tokens}


def prefill_memory(engine: Engine, limit: int) -> PrefillMemory:
    """The memory of a prefill worker serving ``engine``, measured once it is warm (its GEMM
    weights made): what it holds now stays held, each prompt's activations come on top."""
    model = engine.model
    return PrefillMemory(config=engine.config, dtype=engine.prefill_dtype, limit=limit,
                         weights=held_bytes(model),
                         gemm_weights=gemm_weight_bytes(model, engine.prefill_dtype),
                         held=resident_bytes())


@dataclass(frozen=True)
class DecodeMemory:
    """A decode worker's memory: what it holds once loaded, its limit; each pool it makes
    (rows x a layout's K/V, ``kvcache.pool_row_bytes``) must fit beside the pools it keeps."""

    limit: int
    weights: int
    held: int  # resident once loaded, before any pool

    def check_pools(self, kept: int, new: int) -> None:
        """MemoryExhausted when a new pool of ``new`` bytes would not fit beside ``kept``."""
        if self.held + kept + new > self.limit:
            raise MemoryExhausted(
                f"a decode pool of {new / GIB:.2f} GiB for this request's cache layout does not "
                f"fit beside the {(self.held + kept) / GIB:.2f} GiB this worker holds, under its "
                f"memory limit of {self.limit / GIB:.2f} GiB: retry later (pools of finished "
                "layouts are dropped) or on another worker, or ask for a smaller cache budget")

    def report(self) -> dict[str, int]:
        return {"limit": self.limit, "weights": self.weights, "held": self.held}


def decode_memory(engine: Engine, limit: int) -> DecodeMemory:
    """The memory of a decode worker serving ``engine``, measured once it is loaded."""
    return DecodeMemory(limit=limit, weights=held_bytes(engine.model), held=resident_bytes())
