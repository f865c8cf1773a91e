"""A target prefilled from kept tokens at their original positions decodes as full attention
over those tokens at those positions would, and its ring turns as the layout promises."""

from __future__ import annotations

import pytest
import torch

from snapstream.kvcache import EMPTY
from snapstream.policy import CachePolicy
from tests.engine.helpers import engine_for, greedy_with_logits
from tests.tiny_models import random_model, tiny_config, tiny_gemma3_config

PROMPT_LEN = 96
KEPT = [*range(0, 16), *range(40, 56), *range(80, 96)]  # three of six chunks of 16


def _reference_greedy(model, ids: list[int], positions: list[int], steps: int) -> list[int]:
    """Greedy tokens from re-running full attention over everything each step."""
    ids, positions, out = list(ids), list(positions), []
    for _ in range(steps):
        hidden = model(torch.tensor([ids]), torch.tensor([positions]), model.causal_attend)
        out.append(int(model.logits(hidden[0, -1]).argmax()))
        ids.append(out[-1])
        positions.append(positions[-1] + 1)
    return out


@pytest.mark.parametrize("kind", ["full", "snapkv"])
def test_kept_tokens_at_original_positions_decode_like_full_attention_over_them(kind):
    model = random_model(tiny_config(), seed=7)
    prompt = torch.randint(0, 200, (PROMPT_LEN,), generator=torch.Generator().manual_seed(2))
    kept_ids = prompt[KEPT].tolist()
    policy = CachePolicy(kind=kind, n_sink=4, n_topk=64, n_recent=32, observation=8)  # holds all 48
    got = engine_for(model).generate(kept_ids, max_new_tokens=12, policy=policy,
                                     positions=KEPT).token_ids
    assert got == _reference_greedy(model, kept_ids, KEPT, 12)
    # renumbered (compact) is another computation: the positions matter
    at_original = engine_for(model).prefill(kept_ids, policy, 1, positions=KEPT).logits
    renumbered = engine_for(model).prefill(kept_ids, policy, 1).logits
    assert not torch.allclose(at_original, renumbered, atol=1e-3)


def test_the_next_token_overwrites_the_oldest_ring_entry():
    model = random_model(tiny_config(), seed=7)
    kept_ids = list(range(10, 10 + len(KEPT)))
    policy = CachePolicy(kind="snapstream", n_sink=2, n_topk=6, n_recent=10, observation=4)
    cache = engine_for(model).prefill(kept_ids, policy, 4, positions=KEPT).cache
    (part,) = cache.groups  # a model without sliding layers: one group
    layout, held = part.group.layout, part.positions  # (L, Hkv, S)
    assert cache.next_position == PROMPT_LEN and cache.prompt_len == PROMPT_LEN
    ring = held[..., layout.ring_start :]
    assert sorted(ring[0, 0].tolist()) == KEPT[-10:]  # the last 10 kept, at their positions
    oldest = held[..., layout.slot_of(PROMPT_LEN)]
    assert bool((oldest == ring.amin(dim=-1)).all())
    assert bool((held[..., : layout.n_sink] == torch.tensor([0, 1])).all())
    assert bool((held != EMPTY).all())


def test_positions_are_checked():
    engine = engine_for(random_model(tiny_config(max_position_embeddings=128), seed=1))
    policy = CachePolicy(kind="full")
    with pytest.raises(ValueError, match="ascending"):
        engine.prefill([1, 2, 3], policy, 1, positions=[0, 2, 2])
    with pytest.raises(ValueError, match="context"):
        engine.prefill([1, 2, 3], policy, 1, positions=[0, 5, 128])


# a hybrid (Gemma-like) target: kept tokens spread over ~4 windows of the sliding layers
HYBRID_PROMPT_LEN = 200
HYBRID_KEPT = [p for start in range(0, HYBRID_PROMPT_LEN, 24) for p in range(start, start + 8)]


def _windowed_logits(model, ids: list[int], positions: list[int]) -> torch.Tensor:
    """(T, V) logits of a forward over ``ids`` at ``positions`` (ascending) where a global
    layer's query sees every earlier token and a sliding layer's only those whose original
    position lies in its window: q_pos - window < k_pos <= q_pos."""
    at = torch.tensor(positions)  # (T,)
    before = at[None] <= at[:, None]  # (T, T) [query, key]

    def attend(layer_idx: int, q, k, v):
        window = model.config.attention_windows[layer_idx]
        allowed = before if window is None else before & (at[None] > at[:, None] - window)
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, enable_gqa=True)  # (1, Hq, T, D)

    hidden = model(torch.tensor([ids]), at[None], attend)  # (1, T, hidden)
    return model.logits(hidden[0])


@pytest.mark.parametrize("kind", ["full", "snapkv"])
def test_hybrid_kept_tokens_see_their_window_by_original_position(kind):
    """Gemma 3's sliding layers: in the prefill and in every decode step a query sees the kept
    keys within its window of original positions (not the last ``window`` kept tokens, which
    span ~3x as many positions here), as the full forward over the kept tokens does."""
    model = random_model(tiny_gemma3_config(), seed=5)
    window = model.config.sliding_window
    prompt = torch.randint(0, 250, (HYBRID_PROMPT_LEN,), generator=torch.Generator().manual_seed(3))
    kept_ids = prompt[HYBRID_KEPT].tolist()
    policy = CachePolicy(kind=kind, n_sink=4, n_topk=64, n_recent=32, observation=8)  # holds all 72
    steps = 2 * window + 3  # the ring wraps past the prompt's last window twice
    tokens, logits, result = greedy_with_logits(engine_for(model), kept_ids, policy, steps,
                                                positions=HYBRID_KEPT)
    sliding = result.cache.groups[1]
    held = sliding.positions[0, 0]  # (window,)
    in_window = [p for p in HYBRID_KEPT if p > HYBRID_PROMPT_LEN - 1 - window]
    assert sorted(p for p in held.tolist() if p != EMPTY) == in_window
    assert all(held[p % window] == p for p in in_window)  # slot = position % window
    positions = HYBRID_KEPT + list(range(HYBRID_PROMPT_LEN, HYBRID_PROMPT_LEN + steps - 1))
    reference = _windowed_logits(model, kept_ids + tokens[:-1], positions)[len(kept_ids) - 1 :]
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=0)
