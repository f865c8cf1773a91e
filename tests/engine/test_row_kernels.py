"""The row-wise ops of the prompt and decode forwards (snapstream.kernels): RMSNorm and the gated
MLP's act(gate) * up, in float32 and bfloat16, on the CPU's AVX-512 path and on the plain C++
one (SNAPSTREAM_GENERIC_KERNELS=1), against float64 references."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from snapstream import kernels

PATHS = ["0", "1"]  # SNAPSTREAM_GENERIC_KERNELS: the CPU's own path, the plain C++ one
REFERENCES = {"silu": F.silu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh")}
# every row holds a tail shorter than a 16-lane vector except the first shape's
SHAPES = [(2, 4, 64), (3, 70, 37), (5,), (1, 1, 1536)]


def tolerance(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 1e-2  # the output's own rounding


@pytest.mark.parametrize("generic", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_matches_torch(dtype, shape, generic, monkeypatch):
    monkeypatch.setenv("SNAPSTREAM_GENERIC_KERNELS", generic)
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=generator) * 3).to(dtype)
    weight = torch.randn(shape[-1], generator=generator).to(dtype)
    got = kernels.rms_norm(x, weight, 1e-5)
    want = F.rms_norm(x.double(), weight.shape, weight.double(), 1e-5)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.double(), want, atol=tolerance(dtype),
                               rtol=tolerance(dtype))


def gate_up(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """(..., 2I) [gate | up] with gates over the activations' whole curve (|x| up to ~12)."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape[:-1], 2 * shape[-1], generator=generator) * 4).to(dtype)


def gated_reference(x: torch.Tensor, activation: str) -> torch.Tensor:
    gate, up = x.double().chunk(2, dim=-1)
    return REFERENCES[activation](gate) * up


@pytest.mark.parametrize("generic", PATHS)
@pytest.mark.parametrize("activation", list(REFERENCES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_gated_activation_matches_float64(shape, dtype, activation, generic, monkeypatch):
    monkeypatch.setenv("SNAPSTREAM_GENERIC_KERNELS", generic)
    x = gate_up(shape, dtype)
    got = kernels.gated_activation(x, activation)
    assert got.dtype == dtype and got.shape == (*shape[:-1], shape[-1])
    torch.testing.assert_close(got.double(), gated_reference(x, activation),
                               atol=tolerance(dtype), rtol=tolerance(dtype))


@pytest.mark.parametrize("activation", list(REFERENCES))
def test_bfloat16_is_rounded_once(activation):
    """One rounding of the float32 product: never further from float64 than torch's two passes
    (act(gate) rounded to bfloat16, then the product rounded again), and closer on average."""
    x = gate_up((64, 1536), torch.bfloat16)
    want = gated_reference(x, activation)
    ours = (kernels.gated_activation(x, activation).double() - want).abs()
    gate, up = x.chunk(2, dim=-1)
    theirs = ((REFERENCES[activation](gate) * up).double() - want).abs()
    assert ours.max() <= theirs.max()
    assert ours.mean() < theirs.mean()


@pytest.mark.parametrize("generic", PATHS)
@pytest.mark.parametrize("activation", list(REFERENCES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_activation_keeps_torchs_values_at_the_extremes(dtype, activation, generic,
                                                              monkeypatch):
    monkeypatch.setenv("SNAPSTREAM_GENERIC_KERNELS", generic)
    gates = torch.tensor([-float("inf"), -1e30, -200.0, -90.0, -20.0, -1e-3, 0.0, 1e-3, 20.0,
                          90.0, 200.0, 1e30, float("inf"), float("nan"), -0.0, 3.0, 5.5])
    x = torch.cat([gates, torch.ones_like(gates)]).to(dtype)
    got = kernels.gated_activation(x, activation)
    want = REFERENCES[activation](gates.double())
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=tolerance(dtype),
                               equal_nan=True)


def test_other_dtypes_take_atens_two_passes():
    x = gate_up((3, 40), torch.float64)
    for activation, act in REFERENCES.items():
        gate, up = x.chunk(2, dim=-1)
        assert torch.equal(kernels.gated_activation(x, activation), act(gate) * up)


def test_gated_activation_refuses_what_it_cannot_compute():
    with pytest.raises(RuntimeError, match="silu or gelu_tanh"):
        kernels.gated_activation(gate_up((2, 8), torch.float32), "relu")
    with pytest.raises(RuntimeError, match=r"\(\.\.\., 2I\)"):
        kernels.gated_activation(torch.zeros(2, 7), "silu")
