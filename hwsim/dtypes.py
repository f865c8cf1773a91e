"""Number formats the cost model knows, and their size in bytes."""

from __future__ import annotations

from enum import StrEnum


class DType(StrEnum):
    BF16 = "bf16"
    FP8 = "fp8"
    FP32 = "fp32"


DTYPE_BYTES: dict[DType, int] = {DType.BF16: 2, DType.FP8: 1, DType.FP32: 4}


def parse_dtype(name: str, *, field: str = "dtype") -> DType:
    """The DType called ``name``; ValueError naming ``field`` and the choices otherwise."""
    try:
        return DType(name)
    except ValueError:
        choices = ", ".join(d.value for d in DType)
        raise ValueError(f"{field}: unknown {name!r}; choose one of {choices}") from None
