"""A target prefilled from kept tokens at their original positions decodes as full attention
over those tokens at those positions would, and its ring turns as the layout promises."""

from __future__ import annotations

import pytest
import torch

from snapstream.kvcache import EMPTY
from snapstream.policy import CachePolicy
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config

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
    policy = CachePolicy(kind=kind, n_sink=4, n_topk=64, n_recent=32, window=8)  # holds all 48
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
    policy = CachePolicy(kind="snapstream", n_sink=2, n_topk=6, n_recent=10, window=4)
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
