"""The Engine's ``dtype`` choices, torch-free so that the CLIs offer them at parse time.

Each name says what the activations and norms are computed in, whether the linear layers' weights
are quantized after loading (:mod:`snapstream.quant`), and what the KV cache holds: the quantized
formats keep it in bfloat16, half the bytes of float32 (blobs and decode pools alike), for a
KL of ~1e-4 per token on the default model (docs/benchmarks.md).

``auto`` (the default everywhere) serves a checkpoint in the format its weights already have:
a GGUF whose linear layers are Q4_0/Q4_1 blocks runs ``int4`` (the same 4-bit groups of 32),
Q8_0 runs ``int8``, anything else ``float32``.
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
AUTO = "auto"
DTYPE_CHOICES = (AUTO, *WEIGHT_FORMATS)


def weight_format(name: str, native: str = "float32") -> WeightFormat:
    """The format ``name`` names; ``auto`` is ``native``, the checkpoint's own (a name of
    ``WEIGHT_FORMATS``, as ``Checkpoint.native_format`` gives it)."""
    if name not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_CHOICES)}, got {name!r}")
    return WEIGHT_FORMATS[native if name == AUTO else name]
DTYPE_HELP = ("weights, activations and KV cache: auto (the checkpoint's own: int4 for a Q4_0/Q4_1 "
              "GGUF, int8 for Q8_0, else float32), float32, bfloat16, or int8/int4 weights "
              "(CPU) with float32 activations and a bfloat16 KV cache")
