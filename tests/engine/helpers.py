"""Drive the engine's prefill + decode directly, keeping every step's logits."""

from __future__ import annotations

import torch

from snapstream.engine import Engine, PrefillResult
from snapstream.policy import CachePolicy
from tests.tiny_models import tiny_snapstream_tokenizer


def engine_for(model, kv_dtype: torch.dtype | None = None) -> Engine:
    return Engine(model, tiny_snapstream_tokenizer(), kv_dtype=kv_dtype)


def greedy_with_logits(
    engine: Engine, ids: list[int], policy: CachePolicy, steps: int,
    positions: list[int] | None = None,
) -> tuple[list[int], torch.Tensor, PrefillResult]:
    """Greedy tokens (steps,) and the logits (steps, V) that produced each of them;
    ``positions``: the prompt's own (see Engine.prefill), decode continuing after the last."""
    result = engine.prefill(ids, policy, max_new_tokens=steps, positions=positions)
    decoder = engine.new_decoder(result.cache.layout, batch_size=1)
    decoder.cache.insert(0, result.cache)
    logits, tokens = [result.logits], [int(result.logits.argmax())]
    for step in range(steps - 1):
        position = result.cache.next_position + step
        out = decoder.step(torch.tensor([tokens[-1]]), torch.tensor([position]))[0]
        logits.append(out)
        tokens.append(int(out.argmax()))
    return tokens, torch.stack(logits), result
