"""Build a :class:`Transformer` from a checkpoint's config and weights.

With ``keep_blocks`` (the weight format ``gguf``), a GGUF checkpoint's quantized linear weights
become int4/int8 layers straight from its blocks, one tensor at a time (a fused projection once
its parts are read), and only the remaining tensors (norms, float weights) are dequantized: no
float copy of the model is ever made.
"""

from __future__ import annotations

import torch
from torch import nn

from snapstream.checkpoints import Checkpoint
from snapstream.model import FUSED, Transformer, from_hf_state
from snapstream.quant import (
    QUANTIZED_LINEARS,
    GroupedCodes,
    QuantizedEmbedding,
    quantized_linear,
    return_freed_memory,
)
from snapstream.rope import RotaryEmbedding

EMBEDDING = "model.embed_tokens"
_PART_OF = {part: (fused, i, len(parts)) for fused, parts in FUSED.items()
            for i, part in enumerate(parts)}


def load_model(checkpoint: Checkpoint, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", keep_blocks: bool = False) -> Transformer:
    """Build the model on the meta device and assign the checkpoint's tensors into it."""
    config = checkpoint.config
    if keep_blocks and torch.device(device).type != "cpu":
        raise ValueError("quantized weights run on torch's CPU kernels: load on device 'cpu'")
    with torch.device("meta"):
        model = Transformer(config)
    quantized = _load_blocks(model, checkpoint, dtype) if keep_blocks else set()
    state = from_hf_state(checkpoint.state_dict(dtype, skip_blocks=keep_blocks)
                          if keep_blocks else checkpoint.state_dict(dtype))
    for module in quantized:  # a quantized projection's float bias
        if (bias := state.pop(f"{module}.bias", None)) is not None:
            model.get_submodule(module).bias = nn.Parameter(bias, requires_grad=False)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {k for k in model.state_dict()
                if not (config.tie_word_embeddings and k == "lm_head.weight")
                and not any(k.startswith(f"{module}.") for module in quantized)}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        raise ValueError(f"{checkpoint.path}: weights do not match the config: missing "
                         f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings and "lm_head" not in quantized:
        model.lm_head.weight = model.model.embed_tokens.weight
    # real (non-meta) inv_freq buffers
    model.rotary = RotaryEmbedding(config.rope, config.head_dim)
    model.local_rotary = RotaryEmbedding(config.local_rope or config.rope, config.head_dim)
    return model.to(device=device).eval()


def _fused_slot(module: str) -> tuple[str, int, int] | None:
    """'model.layers.3.self_attn.k_proj' -> ('model.layers.3.self_attn.qkv_proj', 1, 3)."""
    for part, (fused, index, count) in _PART_OF.items():
        if module.endswith(f".{part}"):
            return module.removesuffix(part) + fused, index, count
    return None


def _load_blocks(model: Transformer, checkpoint: Checkpoint, dtype: torch.dtype) -> set[str]:
    """Put each quantized linear weight of ``checkpoint`` into ``model`` as an int4/int8 layer;
    the names of the modules replaced."""
    if not hasattr(checkpoint, "block_weights"):
        raise ValueError(f"{checkpoint.path}: the weight format 'gguf' serves a GGUF file's own "
                         "quantized blocks; this checkpoint has none (use dtype auto, float32, "
                         "int8 or int4)")
    pending: dict[str, dict[int, GroupedCodes]] = {}
    replaced = set()
    tied = model.config.tie_word_embeddings
    for name, tensor in checkpoint.block_weights():
        module = name.removesuffix(".weight")
        module = "lm_head" if module == EMBEDDING and tied else module  # the tied head
        if (slot := _fused_slot(module)) is None:
            layer = QUANTIZED_LINEARS[tensor.bits].from_chunks(tensor.chunks(), tensor.rows)
        else:
            module, index, count = slot
            parts = pending.setdefault(module, {})
            parts[index] = tensor.whole()
            if len(parts) < count:
                continue
            del pending[module]
            stacked = GroupedCodes.stacked([parts[i] for i in range(count)])
            del parts  # the parts' codes go before the layer is packed
            layer = quantized_linear(stacked)
        if module == EMBEDDING:  # untied: a table of its own
            model.model.embed_tokens = QuantizedEmbedding(layer, dtype, owns=True)
        else:
            model.set_submodule(module, layer)
        replaced.add(module)
        return_freed_memory()  # the tensor's temporaries, before the next one's
    if "lm_head" in replaced and tied:
        model.model.embed_tokens = QuantizedEmbedding(model.lm_head, dtype)
        replaced.add(EMBEDDING)
    return replaced
