"""The cache invariants of design.md, checked against brute-force references."""

from __future__ import annotations

import math
import random

import pytest
import torch

from snapstream.attention import PrefillRecorder
from snapstream.compress import compress_kv
from snapstream.kvquant import as_bits
from snapstream.policy import CachePolicy
from snapstream.snapkv import snapkv_scores
from tests.engine.helpers import engine_for, greedy_with_logits
from tests.engine.reference import (
    LOGITS_ATOL,
    cache_kept_mask,
    masked_logits,
    record_prefill,
    snapkv_reference_scores,
)
from tests.tiny_models import random_model, tiny_config, tiny_gemma3_config

GQA_SHAPES = [(4, 4), (4, 2), (4, 1), (6, 2), (8, 2)]  # (query heads, kv heads)


def prompt(length: int, seed: int, vocab: int = 256) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=generator).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8,
                                   torch.float8_e4m3fn])
@pytest.mark.parametrize("prompt_len", [1, 40, 64])  # n_kept = 64
@pytest.mark.parametrize("kind", ["snapstream", "snapkv", "streaming", "full"])
def test_a_prompt_that_fits_is_placed_as_the_indexed_path_places_it(kind, prompt_len, dtype):
    """A prompt of at most n_kept tokens is copied whole into slots 0..P-1 (no index); the
    indexed path, taken when the keys come with their rows, places it the same."""
    layout = CachePolicy(kind=kind, n_sink=4, n_topk=28, n_recent=32).layout(prompt_len, 8)
    k, v = torch.randn(2, 3, 2, prompt_len, 64).unbind()  # (L, Hkv, P, D) each
    rows = torch.arange(prompt_len).expand(3, 2, -1)  # (L, Hkv, P): row p holds position p
    whole = compress_kv(layout, k, v, None, dtype)
    indexed = compress_kv(layout, k, v, None, dtype, rows=rows)
    for got, want in zip(whole, indexed, strict=True):  # K, V, positions
        assert got.dtype == want.dtype and torch.equal(as_bits(got), as_bits(want))
    assert bool((whole[2][..., :prompt_len] == torch.arange(prompt_len)).all())


@pytest.mark.parametrize("kind", ["snapstream", "snapkv", "streaming"])
def test_equals_full_while_nothing_is_evicted(kind):
    model = random_model(tiny_config(num_heads=4, num_kv_heads=2))
    engine = engine_for(model)
    ids = prompt(37, seed=1)
    steps = 24  # 37 + 24 = 61 <= budget 64: nothing evicted
    policy = CachePolicy(kind=kind, n_sink=4, n_topk=28, n_recent=32, observation=8)
    full_tokens, full_logits, _ = greedy_with_logits(engine, ids, CachePolicy(kind="full"), steps)
    tokens, logits, result = greedy_with_logits(engine, ids, policy, steps)
    assert result.cache.num_tokens_held == len(ids)
    assert tokens == full_tokens
    torch.testing.assert_close(logits, full_logits, atol=1e-4, rtol=0)


def _check_against_reference(engine, ids, policy, steps):
    tokens, logits, result = greedy_with_logits(engine, ids, policy, steps)
    sequence = ids + tokens[:-1]
    allowed = cache_kept_mask(result.cache, len(sequence), engine.config.num_kv_heads)
    reference = masked_logits(engine.model, sequence, allowed, len(ids),
                              engine.kv_dtype)[len(ids) - 1 :]
    torch.testing.assert_close(logits, reference, atol=LOGITS_ATOL[engine.kv_dtype], rtol=0)
    return result


@pytest.mark.parametrize("case", range(12))
def test_matches_kept_set_reference_after_eviction_and_wraparound(case):
    rng = random.Random(case)
    num_heads, num_kv_heads = GQA_SHAPES[case % len(GQA_SHAPES)]
    model = random_model(tiny_config(num_heads=num_heads, num_kv_heads=num_kv_heads), seed=case)
    engine = engine_for(model)
    n_sink, n_topk, n_recent = rng.randint(0, 4), rng.randint(0, 12), rng.randint(1, 10)
    kind = ["snapstream", "streaming", "snapkv"][case % 3]
    policy = CachePolicy(kind=kind, n_sink=n_sink, n_topk=n_topk, n_recent=n_recent,
                         observation=rng.randint(1, n_sink + n_topk + n_recent),
                         kernel=rng.choice([1, 3, 5]), pooling=rng.choice(["avg", "max"]))
    prompt_len = rng.randint(1, 90)
    steps = 3 * n_recent + rng.randint(2, 20)  # the ring wraps around several times
    result = _check_against_reference(engine, prompt(prompt_len, seed=case), policy, steps)
    (part,) = result.cache.groups  # a Llama model: one layer group, in the policy's layout
    assert part.k.shape[2] == part.group.layout.budget


# (head_dim, query heads per KV head, budget, kernel cap): every head_dim and GQA group the
# decode kernel tiles differently, budgets that are and are not multiples of its tiles (4 and 16
# slots, chunks of 256 merged at the end), on the CPU's own path, the AVX2 one (where the CPU
# has it) and the plain C++ one; test_slot_attention crosses them all
HEAD_SHAPES = [(8, 4, 30, "native"), (8, 8, 64, "avx2"), (16, 2, 270, "generic"),
               (16, 1, 48, "native"), (64, 4, 30, "generic"), (64, 8, 45, "avx2"),
               (64, 2, 256, "native"), (256, 4, 37, "avx2"), (256, 1, 16, "generic")]
SWEEP_STEPS = 4  # the prefill's logits and 3 decode steps


def policy_with_budget(kind: str, budget: int, steps: int) -> tuple[CachePolicy, int]:
    """A ``kind`` policy whose layout holds ``budget`` slots for ``steps`` tokens, and a prompt
    length that fills it: the sized kinds evict at prefill, and streaming again as it decodes."""
    if kind == "full":
        return CachePolicy(kind="full"), budget - steps
    kept = budget - steps if kind == "snapkv" else budget  # snapkv's ring grows by max_new
    n_sink, n_topk = 2, kept // 3
    policy = CachePolicy(kind=kind, n_sink=n_sink, n_topk=n_topk,
                         n_recent=kept - n_sink - n_topk, observation=4)
    return policy, budget + 5


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.int8,
                                      torch.float8_e4m3fn])
@pytest.mark.parametrize("kind", ["full", "streaming", "snapkv", "snapstream"])
@pytest.mark.parametrize(("head_dim", "group", "budget", "cap"), HEAD_SHAPES)
def test_decode_matches_reference_for_every_head_shape(kernel_cap, head_dim, group, budget,
                                                       kind, kv_dtype, cap):
    """Decode attends over exactly the kept set whatever the head shape and budget: a slot lost
    to a tile boundary or a query head mapped to another KV head moves the logits by ~0.1."""
    kernel_cap(cap)
    config = tiny_config(num_heads=2 * group, num_kv_heads=2, head_dim=head_dim)
    engine = engine_for(random_model(config, seed=head_dim + group), kv_dtype=kv_dtype)
    policy, prompt_len = policy_with_budget(kind, budget, SWEEP_STEPS)
    result = _check_against_reference(engine, prompt(prompt_len, seed=budget), policy,
                                      SWEEP_STEPS)
    (part,) = result.cache.groups
    assert part.group.layout.budget == budget and part.k.dtype == kv_dtype


def test_full_policy_matches_plain_causal_forward():
    model = random_model(tiny_config())
    engine = engine_for(model)
    _check_against_reference(engine, prompt(50, seed=3), CachePolicy(kind="full"), 20)


@pytest.mark.parametrize("kind", ["snapstream", "streaming"])
def test_one_cache_shape_for_every_prompt_length(kind):
    engine = engine_for(random_model(tiny_config()))
    policy = CachePolicy(kind=kind, n_sink=4, n_topk=20, n_recent=16, observation=8)
    shapes = set()
    for length in (1, 7, 39, 40, 41, 300, 1000):
        cache = engine.prefill(prompt(length, seed=length), policy, max_new_tokens=50).cache
        shapes.add(tuple(tuple(t.shape) for part in cache.groups
                         for t in (part.k, part.v, part.positions)))
        assert cache.num_tokens_held == min(length, policy.budget)
    assert len(shapes) == 1


def test_prefill_keeps_one_layer_uncompressed_at_a_time():
    """Each layer's K/V is compressed as soon as the layer has run: what the prefill holds after
    layer l is l + 1 compressed layers, never a whole prompt's K/V of an earlier layer."""
    model = random_model(tiny_config())
    engine = engine_for(model)
    policy = CachePolicy(kind="snapstream", n_sink=2, n_topk=10, n_recent=12, observation=6)
    ids = prompt(200, seed=5)
    layout = engine.model_layout(policy.layout(len(ids), 8))
    held = []

    class Watching(PrefillRecorder):
        def __call__(self, layer_idx, q, k, v):
            out = super().__call__(layer_idx, q, k, v)
            held.append([tuple(kept[0].shape) for kept in self.kept.values()])
            return out

    recorder = Watching(layout, torch.float32, observation=policy.observation, kernel=policy.kernel,
                        pooling=policy.pooling)
    model(torch.tensor([ids]), torch.arange(len(ids))[None], recorder)
    per_layer = (model.config.num_kv_heads, policy.budget, model.config.head_dim)
    assert held == [[per_layer] * (layer + 1) for layer in range(model.config.num_layers)]
    # and the result is the whole-prompt compression's
    whole = engine.prefill(ids, policy, 8).cache
    assert torch.equal(recorder.cache(len(ids)).groups[0].positions, whole.groups[0].positions)


@pytest.mark.parametrize("config", [tiny_config(num_layers=3), tiny_gemma3_config()],
                         ids=["llama", "gemma3"])
def test_the_final_layer_runs_for_the_last_position_alone(config):
    """The prefill's recorder cuts the final layer to the last position (``outputs=1``): the
    same cache (K/V and SnapKV's choice, bit for bit) and the same last hidden state as a
    forward of every position."""
    model = random_model(config)
    engine = engine_for(model)
    policy = CachePolicy(kind="snapstream", n_sink=2, n_topk=10, n_recent=12, observation=6)
    ids = prompt(120, seed=7)
    layout = engine.model_layout(policy.layout(len(ids), 8))
    hidden, caches = {}, {}
    for outputs in (None, 1):
        recorder = PrefillRecorder(layout, torch.float32, observation=policy.observation,
                                   kernel=policy.kernel, pooling=policy.pooling,
                                   outputs=outputs)
        hidden[outputs] = model(torch.tensor([ids]), torch.arange(len(ids))[None], recorder)
        caches[outputs] = recorder.cache(len(ids))
    assert hidden[None].shape[1] == len(ids) and hidden[1].shape[1] == 1
    torch.testing.assert_close(hidden[1][:, -1], hidden[None][:, -1], atol=1e-5, rtol=1e-5)
    for cut, whole in zip(caches[1].groups, caches[None].groups, strict=True):
        for part in ("k", "v", "positions"):
            assert torch.equal(getattr(cut, part), getattr(whole, part))


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "pooling", "kernel"),
                         [(4, 2, "avg", 5), (4, 1, "max", 3), (6, 2, "avg", 7), (4, 4, "max", 1)])
def test_snapkv_selection_matches_paper_reference(num_heads, num_kv_heads, pooling, kernel):
    model = random_model(tiny_config(num_heads=num_heads, num_kv_heads=num_kv_heads), seed=7)
    engine = engine_for(model)
    ids = prompt(120, seed=11)
    policy = CachePolicy(kind="snapstream", n_sink=3, n_topk=17, n_recent=9, observation=12,
                         kernel=kernel, pooling=pooling)
    cache = engine.prefill(ids, policy, max_new_tokens=1).cache
    picked = cache.groups[0].positions[:, :, policy.n_sink : policy.n_sink + policy.n_topk].long()
    queries, keys = record_prefill(model, ids)
    for layer, (q, k) in enumerate(zip(queries, keys, strict=True)):
        scores = snapkv_reference_scores(q[:, -policy.observation :], k, kernel, pooling)
        candidates = scores[:, policy.n_sink : len(ids) - policy.n_recent]
        for head in range(num_kv_heads):
            expected = candidates[head].topk(policy.n_topk).indices + policy.n_sink
            got = picked[layer, head]
            assert got.tolist() == sorted(got.tolist())
            differ = set(got.tolist()) ^ set(expected.tolist())
            kth = candidates[head].topk(policy.n_topk).values[-1]
            # only exact ties at the k-th score may be broken differently
            assert all(abs(scores[head, p] - kth) < 1e-9 for p in differ), (layer, head, differ)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "pooling", "kernel"),
                         [(4, 2, "avg", 5), (4, 1, "max", 3)])
def test_snapkv_scores_keys_given_at_their_positions(num_heads, num_kv_heads, pooling, kernel):
    """A subset of a prompt's keys, in any order, with their positions (a stored document's and
    its question's) scores as the reference does when only those keys exist."""
    model = random_model(tiny_config(num_heads=num_heads, num_kv_heads=num_kv_heads), seed=7)
    queries, keys = record_prefill(model, prompt(60, seed=12))
    q, k = queries[1], keys[1]  # (Hq, P, D), (Hkv, P, D)
    observed, generator = 8, torch.Generator().manual_seed(5)
    positions = torch.stack([
        torch.cat((torch.randperm(52, generator=generator)[:30], torch.arange(52, 60)))
        [torch.randperm(38, generator=generator)] for _ in range(num_kv_heads)
    ])  # (Hkv, 38): 30 keys before the observed queries and their 8, shuffled
    present = torch.zeros(num_kv_heads, 60, dtype=torch.bool).scatter_(1, positions, True)
    subset = k.gather(1, positions[..., None].expand(-1, -1, k.shape[2]))  # (Hkv, 38, D)
    got = snapkv_scores(q[:, -observed:], subset, kernel, pooling, positions)
    expected = snapkv_reference_scores(q[:, -observed:], k, kernel, pooling, present)
    assert torch.equal(got == -math.inf, expected == -math.inf)
    assert (got == -math.inf).sum() == num_kv_heads * 22
    finite = expected.isfinite()
    torch.testing.assert_close(got[finite].double(), expected[finite], atol=1e-6, rtol=1e-5)
