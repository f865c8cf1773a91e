"""glibc's malloc settings for a process that runs long prompts, and the error of work that does
not fit a worker's memory (torch-free: the services' error table reads it)."""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt parameters (glibc's malloc.h)


class MemoryExhausted(Exception):
    """Work a worker cannot hold within its memory limit (snapstream.memory_plan): the services
    answer RESOURCE_EXHAUSTED with a retry hint, HTTP 429."""


def keep_freed_memory() -> bool:
    """Serve every allocation from the heap and keep what is freed for the next ones. By
    default glibc maps each large block afresh and unmaps it when freed, so a prompt's
    activations (tens of MB per op at 4k tokens) page-fault in again at every op: ~300k faults
    per 4k-token prefill of SmolLM2, and its MLP GEMMs ran 1.6-1.7x slower at 4k and 8k
    (docs/benchmarks.md, "Prefill"). The process then holds its peak memory. Returns
    False where the C library has no ``mallopt`` (not glibc); nothing changes there."""
    mallopt = getattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
