"""The row-wise ops of the prompt and decode forwards (snapstream.kernels): RMSNorm, RoPE and the
gated MLP's act(gate) * up, in float32 and bfloat16, on each instruction set the CPU has down to
the plain C++ path (kernels.distinct_caps()), against float64 references or torch's own ops."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from snapstream import kernels
from snapstream.rope import apply_rotary

CAPS = kernels.distinct_caps()
REFERENCES = {"silu": F.silu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh")}
# every row holds a tail shorter than a 16-lane vector except the first shape's
SHAPES = [(2, 4, 64), (3, 70, 37), (5,), (1, 1, 1536)]


def tolerance(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 1e-2  # the output's own rounding


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_matches_torch(dtype, shape, cap, kernel_cap):
    kernel_cap(cap)
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


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("activation", list(REFERENCES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_gated_activation_matches_float64(shape, dtype, activation, cap, kernel_cap):
    kernel_cap(cap)
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


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("activation", list(REFERENCES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_activation_keeps_torchs_values_at_the_extremes(dtype, activation, cap,
                                                              kernel_cap):
    kernel_cap(cap)
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


def heads_of_a_projection(batch: int, tokens: int, dim: int, dtype: torch.dtype, seed: int = 0
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The query heads of a fused QKV projection's output, (B, T, 3, D) of its (B, T, 6, D)
    (rows strided as the model hands them over), and cos, sin (B, 1, T, D) float32 (as
    rope.RotaryEmbedding makes them)."""
    generator = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(batch, tokens, 6, dim, generator=generator) * 3).to(dtype)
    angles = torch.rand(batch, 1, tokens, dim, generator=generator) * 100
    return qkv[:, :, :3], angles.cos(), angles.sin()


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("factor", [1.0, 0.37])
@pytest.mark.parametrize("dim", [2, 8, 20, 64, 256])  # halves with and without a lane tail
def test_float32_rotary_is_torchs_bit_for_bit(dim, factor, cap, kernel_cap):
    """float32 heads come out as rope.apply_rotary's products and sum (each rounded, none
    fused) times the query factor: the decode step's module path and decode_layer.cpp agree
    bit for bit only so."""
    kernel_cap(cap)
    x, cos, sin = heads_of_a_projection(2, 19, dim, torch.float32)
    x[:, ::3, :, ::2] = 0.0  # zeros (+0 and -0 from the products): their signs compared too
    x[:, 1::3, :, 1::2] = -0.0
    cos[..., ::4] = 0.0
    got = kernels.rotary(x, cos, sin, factor)  # (B, T, H, D)
    want = apply_rotary(x.transpose(1, 2), cos, sin)  # (B, H, T, D)
    want = want * factor if factor != 1.0 else want
    assert got.is_contiguous()
    assert torch.equal(got.transpose(1, 2).view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("cap", CAPS)
def test_bfloat16_rotary_is_rounded_once(cap, kernel_cap):
    """bfloat16 heads: the float32 rotation of the same values, rounded once at the end."""
    kernel_cap(cap)
    x, cos, sin = heads_of_a_projection(1, 33, 64, torch.bfloat16, seed=1)
    got = kernels.rotary(x, cos, sin, 0.5)
    want = apply_rotary(x.transpose(1, 2).float(), cos, sin) * 0.5
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.transpose(1, 2), want.bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_off_the_cpu_gives_the_cpu_bits(dtype):
    """The op's torch form (what other devices run) rotates and rounds as the kernel does."""
    x, cos, sin = heads_of_a_projection(2, 21, 64, dtype, seed=2)
    for factor in (1.0, 0.37):
        cpu = kernels.rotary(x, cos, sin, factor)
        elsewhere = kernels._rotary_elsewhere(x, cos, sin, factor)
        assert elsewhere.dtype == dtype and torch.equal(elsewhere, cpu)


def test_rotary_refuses_what_it_cannot_rotate():
    x, cos, sin = heads_of_a_projection(1, 4, 8, torch.float32)
    with pytest.raises(RuntimeError, match="D even"):
        kernels.rotary(x[..., :7], cos[..., :7], sin[..., :7], 1.0)
    with pytest.raises(RuntimeError, match="B x T x D values"):
        kernels.rotary(x, cos[:, :, :3], sin[:, :, :3], 1.0)
