"""Rotary position embeddings, including Llama-3.1's ``llama3`` frequency scaling."""

from __future__ import annotations

import math

import torch

from snapstream.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """(head_dim/2,) float32 inverse frequencies, scaled as ``rope.rope_type`` asks."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)  # (D/2,)
    if rope.rope_type == "llama3":
        inv_freq = _llama3_scale(inv_freq, rope)
    if rope.freq_factors:
        if len(rope.freq_factors) != inv_freq.shape[0]:
            raise ValueError(f"rope freq_factors: {len(rope.freq_factors)} given, the head "
                             f"dimension needs {inv_freq.shape[0]}")
        inv_freq = inv_freq / torch.tensor(rope.freq_factors, dtype=torch.float32)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    low_freq_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_freq_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Computes cos/sin for arbitrary absolute positions (no table, so no length limit)."""

    def __init__(self, rope: RopeConfig, head_dim: int) -> None:
        super().__init__()
        inv_freq = inverse_frequencies(rope, head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _apply(self, fn, recurse: bool = True):  # device moves only: inv_freq stays float32
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq.to(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """positions (B, T) int -> cos, sin (B, 1, T, D) float32, whatever the activations' dtype
        (``kernels.rotary`` rotates in float32 and rounds once)."""
        freqs = positions[..., None].float() * self.inv_freq  # (B, T, D/2)
        angles = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, D)
        return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D) rotated by cos/sin (B, 1, T, D), half-split (Llama) convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
