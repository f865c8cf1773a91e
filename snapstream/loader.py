"""Build a :class:`Transformer` from a checkpoint's config and weights."""

from __future__ import annotations

import torch

from snapstream.checkpoints import Checkpoint
from snapstream.model import Transformer, from_hf_state
from snapstream.rope import RotaryEmbedding


def load_model(checkpoint: Checkpoint, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> Transformer:
    """Build the model on the meta device and assign the checkpoint's tensors into it."""
    config = checkpoint.config
    with torch.device("meta"):
        model = Transformer(config)
    state = from_hf_state(checkpoint.state_dict(dtype))
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {k for k in model.state_dict()
                if not (config.tie_word_embeddings and k == "lm_head.weight")}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        raise ValueError(f"{checkpoint.path}: weights do not match the config: missing "
                         f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # real (non-meta) inv_freq buffers
    model.rotary = RotaryEmbedding(config.rope, config.head_dim)
    model.local_rotary = RotaryEmbedding(config.local_rope or config.rope, config.head_dim)
    return model.to(device=device).eval()
