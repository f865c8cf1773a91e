"""A long prompt's MLP runs in chunks of at most MLP_CHUNK_ROWS rows, all of one size, and gives
what it gives over all rows at once."""

from __future__ import annotations

import pytest
import torch

from snapstream import model
from snapstream.config import ModelConfig


def mlp(activation: str) -> model.MLP:
    config = ModelConfig(vocab_size=32, hidden_size=64, intermediate_size=96, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=32, max_position_embeddings=64,
                         hidden_act=activation)
    torch.manual_seed(0)
    return model.MLP(config)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 17, 24, 57])
def test_chunks_are_equal_and_give_the_whole_rows_result(monkeypatch, activation, rows):
    monkeypatch.setattr(model, "MLP_CHUNK_ROWS", 8)
    layer = mlp(activation)
    x = torch.randn(1, rows, 64)
    whole = layer._rows(x)
    seen = []  # rows of each call

    def rows_seen(part: torch.Tensor) -> torch.Tensor:
        seen.append(part.numel() // 64)
        return model.MLP._rows(layer, part)

    monkeypatch.setattr(layer, "_rows", rows_seen)
    out = layer(x)
    assert out.shape == (1, rows, 64)
    torch.testing.assert_close(out, whole, atol=1e-6, rtol=1e-6)
    assert max(seen) <= 8 and max(seen) - min(seen) <= 1 and sum(seen) == rows
    assert len(seen) == -(-rows // 8)
