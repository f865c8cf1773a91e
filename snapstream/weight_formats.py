"""The Engine's ``dtype`` choices, torch-free so that the CLIs offer them at parse time.

Each name says what the activations, norms and KV cache are computed in, and whether the linear
layers' weights are quantized after loading (:mod:`snapstream.quant`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightFormat:
    compute: str  # torch dtype name of activations, norms and the KV cache
    quant: str | None = None  # weight-only scheme of snapstream.quant.QUANT_SCHEMES; None: none


WEIGHT_FORMATS = {
    "float32": WeightFormat("float32"),
    "bfloat16": WeightFormat("bfloat16"),
    "int8": WeightFormat("float32", quant="int8"),
    "int4": WeightFormat("float32", quant="int4"),
}
DTYPE_CHOICES = tuple(WEIGHT_FORMATS)


def weight_format(name: str) -> WeightFormat:
    if name not in WEIGHT_FORMATS:
        raise ValueError(f"dtype must be one of {sorted(WEIGHT_FORMATS)}, got {name!r}")
    return WEIGHT_FORMATS[name]
