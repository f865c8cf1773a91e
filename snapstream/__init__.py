"""SnapStream: long-context LLM serving with a fixed-size (SnapKV + ring buffer) KV cache.

``from snapstream import Engine, CachePolicy, SamplingParams``. Exports resolve lazily so that
light users (the generated gRPC code, the router, the CLI's --help) do not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Engine": "snapstream.engine",
    "GenerationResult": "snapstream.engine",
    "PrefillResult": "snapstream.engine",
    "CachePolicy": "snapstream.policy",
    "CacheLayout": "snapstream.policy",
    "SamplingParams": "snapstream.sampling_params",
    "SequenceCache": "snapstream.kvcache",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'snapstream' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
