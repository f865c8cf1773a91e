"""A hybrid model's cache (sliding-window + global layers) as two layer groups: the sliding
layers keep a ring of exactly their window under every policy, the global layers the policy's
layout; decode equals brute-force references that apply both rules."""

from __future__ import annotations

import pytest
import torch

from snapstream.config import FULL, SLIDING
from snapstream.kvcache import EMPTY, window_layout
from snapstream.policy import CachePolicy
from tests.engine.helpers import engine_for, greedy_with_logits
from tests.engine.reference import LOGITS_ATOL, cache_kept_mask, masked_logits
from tests.tiny_models import random_model, tiny_config

WINDOW = 12
# Gemma 3's pattern in miniature: sliding, sliding, global, sliding
HYBRID = tiny_config(num_layers=4, layer_types=(SLIDING, SLIDING, FULL, SLIDING),
                     sliding_window=WINDOW, num_heads=4, num_kv_heads=2)
KINDS = ["full", "streaming", "snapkv", "snapstream"]
SMALL = dict(n_sink=2, n_topk=6, n_recent=5, observation=4)  # a global budget of 13 > WINDOW


@pytest.fixture(scope="module")
def engine():
    return engine_for(random_model(HYBRID, seed=3))


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def policy_of(kind: str) -> CachePolicy:
    return CachePolicy(kind="full") if kind == "full" else CachePolicy(kind=kind, **SMALL)


@pytest.mark.parametrize("kind", KINDS)
def test_sliding_layers_hold_a_ring_of_exactly_their_window(engine, kind):
    policy = policy_of(kind)
    shapes = set()
    for length in (1, 5, WINDOW - 1, WINDOW, WINDOW + 1, 40, 300):
        cache = engine.prefill(prompt(length, seed=length), policy, max_new_tokens=8).cache
        global_part, sliding = cache.groups
        assert global_part.group.layers == (2,) and global_part.group.window is None
        assert global_part.group.layout == policy.layout(length, 8)
        assert sliding.group.layers == (0, 1, 3) and sliding.group.window == WINDOW
        assert sliding.group.layout == window_layout(WINDOW)
        assert sliding.k.shape == (3, 2, WINDOW, HYBRID.head_dim)
        # the last min(P, W) prompt tokens, each in slot position % W; the rest empty
        expected = torch.full((WINDOW,), EMPTY, dtype=torch.int32)
        held = torch.arange(max(0, length - WINDOW), length, dtype=torch.int32)
        expected[held % WINDOW] = held
        assert torch.equal(sliding.positions, expected.expand(3, 2, -1))
        if policy.is_fixed_size:
            shapes.add(tuple(tuple(part.k.shape) for part in cache.groups))
    assert len(shapes) <= 1  # fixed-size kinds: one shape per group for every prompt length


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.int8])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("length", [3, WINDOW, 29, 70])
def test_decode_matches_the_windowed_kept_set_reference(engine, kind, length, kv_dtype):
    """Past the window in prefill and in decode (the ring wraps twice): the sliding layers see
    exactly the last ``WINDOW`` tokens, the global ones the policy's kept set; with an int8
    cache, both groups' rows quantized as the reference quantizes them."""
    engine = engine_for(engine.model, kv_dtype=kv_dtype)
    ids = prompt(length, seed=length + 1)
    steps = 2 * WINDOW + 3
    tokens, logits, result = greedy_with_logits(engine, ids, policy_of(kind), steps)
    assert all(part.k.dtype == kv_dtype for part in result.cache.groups)
    sequence = ids + tokens[:-1]
    allowed = cache_kept_mask(result.cache, len(sequence), HYBRID.num_kv_heads)
    reference = masked_logits(engine.model, sequence, allowed, len(ids),
                              kv_dtype)[len(ids) - 1 :]
    torch.testing.assert_close(logits, reference, atol=LOGITS_ATOL[kv_dtype], rtol=0)


@pytest.mark.parametrize("length", [5, 40])
def test_full_decode_equals_the_plain_windowed_forward(engine, length):
    """``full`` on a hybrid model is the model as trained: every greedy step equals a forward
    over the whole sequence with causal attention, windowed on the sliding layers."""
    ids = prompt(length, seed=9)
    tokens, logits, _ = greedy_with_logits(engine, ids, CachePolicy(kind="full"), 30)
    sequence = torch.tensor([ids + tokens[:-1]])
    model = engine.model
    with torch.no_grad():
        hidden = model(sequence, torch.arange(sequence.shape[1])[None], model.causal_attend)
    expected = model.logits(hidden[0])[length - 1 :]  # (steps, V)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
    assert tokens == expected.argmax(-1).tolist()


def test_rows_join_and_leave_a_two_group_pool_independently(engine):
    """Continuous batching: sequences of different lengths enter rows of one pool at different
    steps, one leaves (its row cleared) and another takes its row; each row's logits equal
    that sequence decoded alone."""
    policy = CachePolicy(kind="snapstream", **SMALL)
    prompts = {0: prompt(50, 1), 1: prompt(4, 2), 2: prompt(17, 3)}
    results = {seq: engine.prefill(ids, policy, 1) for seq, ids in prompts.items()}
    alone = {seq: greedy_with_logits(engine, ids, policy, 16)[0] for seq, ids in prompts.items()}
    decoder = engine.new_decoder(results[0].cache.layout, batch_size=2)
    schedule = {0: [(0, 0), (1, 1)], 6: [(1, 2)]}  # step -> (row, sequence) joining
    rows: dict[int, tuple[int, int]] = {}  # row -> (sequence, tokens generated so far)
    for step in range(14):
        for row, seq in schedule.get(step, []):
            decoder.cache.clear(row)  # the row's previous sequence leaves
            decoder.cache.insert(row, results[seq].cache)
            rows[row] = (seq, 1)
        tokens = torch.tensor([alone[seq][done - 1] for seq, done in rows.values()])
        positions = torch.tensor([len(prompts[seq]) + done - 1 for seq, done in rows.values()])
        greedy = decoder.step(tokens, positions).argmax(-1).tolist()
        for row, (seq, done) in list(rows.items()):
            assert greedy[row] == alone[seq][done], (step, row, seq)
            rows[row] = (seq, done + 1)
