"""The Engine's ``dtype`` choices, torch-free so that the CLIs offer them at parse time.

Each name says what the activations and norms are computed in, whether the linear layers' weights
are quantized after loading (:mod:`snapstream.quant`), and what the KV cache holds: the quantized
formats keep it in bfloat16, half the bytes of float32 (blobs and decode pools alike), for a
KL of ~1e-4 per token on the default model (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightFormat:
    compute: str  # torch dtype name of activations and norms
    quant: str | None = None  # weight-only scheme of snapstream.quant.QUANT_SCHEMES; None: none
    kv: str | None = None  # torch dtype name of the KV cache; None: ``compute``

    @property
    def kv_dtype(self) -> str:
        return self.kv or self.compute


WEIGHT_FORMATS = {
    "float32": WeightFormat("float32"),
    "bfloat16": WeightFormat("bfloat16"),
    "int8": WeightFormat("float32", quant="int8", kv="bfloat16"),
    "int4": WeightFormat("float32", quant="int4", kv="bfloat16"),
}
DTYPE_CHOICES = tuple(WEIGHT_FORMATS)


def weight_format(name: str) -> WeightFormat:
    if name not in WEIGHT_FORMATS:
        raise ValueError(f"dtype must be one of {sorted(WEIGHT_FORMATS)}, got {name!r}")
    return WEIGHT_FORMATS[name]
