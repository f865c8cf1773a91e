"""config.json parsing: what a checkpoint's config must say, and the error when it does not."""

from __future__ import annotations

import pytest

from snapstream.config import REQUIRED_KEYS, ModelConfig

LLAMA = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4}


def test_the_required_keys_alone_make_a_llama_config():
    config = ModelConfig.from_dict(LLAMA)
    shape = (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim)
    assert shape == (2, 4, 4, 8)


@pytest.mark.parametrize("key", REQUIRED_KEYS)
def test_a_missing_required_key_is_named(key):
    raw = {k: v for k, v in LLAMA.items() if k != key}
    with pytest.raises(ValueError, match=f"config.json lacks {key}"):
        ModelConfig.from_dict(raw)


def test_an_empty_config_names_every_missing_key():
    with pytest.raises(ValueError) as info:
        ModelConfig.from_dict({})
    assert all(key in str(info.value) for key in REQUIRED_KEYS)
