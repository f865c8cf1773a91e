"""The Engine's ``dtype`` choices, torch-free so that the CLIs offer them at parse time.

Each name says what the activations and norms are computed in (in decode, and in the prompt
forward: for the quantized formats the CPU's GEMM dtype, ``snapstream.cpu.matmul_dtype_name``:
bfloat16 where the CPU multiplies it in hardware, else float32), whether the linear layers' weights
are quantized after loading (:mod:`snapstream.quant`), and what the KV cache holds: the quantized
formats keep it in int8 (codes with a float32 scale per slot and head: ~a quarter of float32's
bytes, blobs and decode pools alike), which answers as the bfloat16 cache does within one answer
per task on the accuracy grid at 1/4 and 1/8 (docs/benchmarks.md, "KV dtypes").

``gguf`` serves a GGUF file's quantized blocks as they are: each linear weight held in Q4_0,
Q4_1, Q4_K (int4 codes) or Q5_0, Q5_1, Q5_K, Q6_K, Q8_0 (int8 codes) becomes exact codes with
their scales and offsets (snapstream/checkpoints/gguf_blocks.py), read tensor by tensor; the
other formats requantize or convert float weights.

``auto`` (the default everywhere) serves a checkpoint in the format its weights already have:
``gguf`` for a GGUF whose linear layers are all in those block types, else ``float32``.

``kv_dtype`` (``--kv-dtype``) overrides a format's KV dtype: one of :data:`KV_DTYPES`, the
names of snapstream.kvquant's registry (``int8``: codes with a float32 scale per slot and head;
``float8_e4m3fn``: fp8 e4m3 values of each row's Hadamard transform, no scale).
"""

from __future__ import annotations

from dataclasses import dataclass

from snapstream.cpu import matmul_dtype_name

MATMUL = "matmul"  # a prompt dtype: the CPU's GEMM dtype (snapstream.cpu.matmul_dtype_name)


@dataclass(frozen=True)
class WeightFormat:
    compute: str  # torch dtype name of activations and norms
    quant: str | None = None  # weight-only scheme of snapstream.quant.QUANT_SCHEMES; None: none
    kv: str | None = None  # torch dtype name of the KV cache; None: ``compute``
    keep_blocks: bool = False  # linear weights from the GGUF's own blocks (snapstream.loader)
    prefill: str | None = None  # torch dtype name of the prompt forward's activations, or
    # MATMUL (the quantized formats: their prompt GEMMs run in that dtype anyway); None: compute

    @property
    def kv_dtype(self) -> str:
        return self.kv or self.compute

    @property
    def prefill_dtype(self) -> str:
        return matmul_dtype_name() if self.prefill == MATMUL else self.prefill or self.compute


WEIGHT_FORMATS = {
    "float32": WeightFormat("float32"),
    "bfloat16": WeightFormat("bfloat16"),
    "int8": WeightFormat("float32", quant="int8", kv="int8", prefill=MATMUL),
    "int4": WeightFormat("float32", quant="int4", kv="int8", prefill=MATMUL),
    "gguf": WeightFormat("float32", kv="int8", keep_blocks=True, prefill=MATMUL),
}
AUTO = "auto"
DTYPE_CHOICES = (AUTO, *WEIGHT_FORMATS)


def weight_format(name: str, native: str = "float32") -> WeightFormat:
    """The format ``name`` names; ``auto`` is ``native``, the checkpoint's own (a name of
    ``WEIGHT_FORMATS``, as ``Checkpoint.native_format`` gives it)."""
    if name not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_CHOICES)}, got {name!r}")
    return WEIGHT_FORMATS[native if name == AUTO else name]


# the names of snapstream.kvquant.KV_CODECS served
KV_DTYPES = ("float32", "bfloat16", "int8", "float8_e4m3fn")


def kv_dtype_name(name: str | None, fmt: WeightFormat) -> str:
    """The KV dtype ``name`` names; None: ``fmt``'s own."""
    if name is None:
        return fmt.kv_dtype
    if name not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {list(KV_DTYPES)}, got {name!r}")
    return name


KV_DTYPE_HELP = ("what the KV cache holds (sequence caches, blobs, decode pools): float32, "
                 "bfloat16, int8 (codes with a float32 scale per slot and head) or float8_e4m3fn "
                 "(fp8 e4m3 values of each row's Hadamard transform, no scale); default: the "
                 "--dtype format's (int8 for the quantized formats)")
DTYPE_HELP = ("weights, activations and KV cache: auto (the checkpoint's own: gguf for a GGUF of "
              "quantized blocks, else float32), float32, bfloat16, gguf (the GGUF's blocks as "
              "exact int4/int8 codes), or int8/int4 requantized weights (CPU); the quantized "
              "formats keep float32 activations in decode, bfloat16 in the prompt (float32 on "
              "CPUs without bfloat16 instructions), and an "
              "int8 KV cache")
