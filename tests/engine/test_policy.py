from __future__ import annotations

from dataclasses import replace

import pytest

from snapstream.policy import (
    KIND_OWN_FIELDS,
    POLICY_FILE,
    CacheLayout,
    CachePolicy,
    load_default_policy,
    resolve_policy,
)


@pytest.mark.parametrize(("fields", "name"), [
    ({"n_sink": -1}, "n_sink"), ({"n_topk": -3}, "n_topk"), ({"n_recent": -1}, "n_recent"),
    ({"n_recent": 0}, "n_recent"), ({"observation": 0}, "observation"),
    ({"observation": 2000, "n_topk": 10}, "observation"), ({"kernel": 4}, "kernel"),
    ({"kernel": 0}, "kernel"), ({"pooling": "median"}, "pooling"), ({"kind": "lru"}, "kind"),
    ({"observe": "first"}, "observe"),
])
def test_invalid_policies_name_the_field(fields, name):
    with pytest.raises(ValueError, match=name):
        CachePolicy(**fields)


def test_budget_beyond_context_is_rejected():
    with pytest.raises(ValueError, match="exceeds the model's context"):
        CachePolicy(n_topk=3000).check_context(2048)
    CachePolicy(kind="full", n_topk=3000).check_context(2048)  # full has no budget


def test_layouts_per_kind():
    policy = dict(n_sink=4, n_topk=10, n_recent=6, observation=4)
    assert CachePolicy(kind="snapstream", **policy).layout(100, 50) == CacheLayout(4, 10, 6, 6)
    assert CachePolicy(kind="streaming", **policy).layout(100, 50) == CacheLayout(4, 0, 16, 16)
    assert CachePolicy(kind="snapkv", **policy).layout(100, 50) == CacheLayout(4, 10, 6, 56)
    assert CachePolicy(kind="full", **policy).layout(100, 50) == CacheLayout(0, 0, 150, 150)


def test_ring_overwrites_the_oldest_entry():
    layout = CacheLayout(n_sink=2, n_topk=3, n_recent=4, n_ring=4)
    slots = [layout.slot_of(p) for p in range(14)]
    assert slots[:5] == [0, 1, 2, 3, 4]
    assert slots[5:9] == [5, 6, 7, 8]
    assert slots[9:] == [5, 6, 7, 8, 5]  # position 9 replaces position 5, and so on


def test_capacity_sizes_growing_policies_only():
    fields = dict(n_sink=4, n_topk=10, n_recent=6, observation=4)
    assert CachePolicy(kind="full", **fields).layout(100, 50, 2048).n_ring == 2048
    assert CachePolicy(kind="snapkv", **fields).layout(100, 50, 2048) == CacheLayout(4, 10, 6,
                                                                                    2034)
    assert CachePolicy(kind="snapstream", **fields).layout(100, 50, 2048) == CacheLayout(4, 10, 6,
                                                                                        6)
    with pytest.raises(ValueError, match="capacity"):
        CachePolicy(kind="full").layout(2000, 100, 2048)
    assert CachePolicy().layout(2000, 5000, 2048).budget == CachePolicy().budget  # fixed: no cap


def test_a_checkpoint_without_a_policy_file_gets_the_defaults(tmp_path):
    assert load_default_policy(tmp_path / POLICY_FILE) == CachePolicy()


def test_a_checkpoint_policy_file_overrides_the_defaults(tmp_path):
    (tmp_path / POLICY_FILE).write_text('{"kernel": 15, "n_topk": 100}')
    assert load_default_policy(tmp_path / POLICY_FILE) == CachePolicy(kernel=15, n_topk=100)


@pytest.mark.parametrize(("text", "match"), [
    ('{"kernal": 15}', "fields among"), ('[15]', "fields among"), ('{"kernel": 4}', "kernel"),
])
def test_a_bad_checkpoint_policy_file_is_named(tmp_path, text, match):
    (tmp_path / POLICY_FILE).write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        load_default_policy(tmp_path / POLICY_FILE)
    assert POLICY_FILE in str(info.value)


def test_kernel_is_bounded_by_the_context_and_names_the_bound():
    with pytest.raises(ValueError, match="kernel must be at most the model's context of 2048"):
        CachePolicy(kernel=2**32 - 1).check_context(2048)
    CachePolicy(kernel=2047).check_context(2048)


@pytest.mark.parametrize("pooling", ["avg", "max"])
def test_a_kernel_wider_than_the_prompt_pools_like_one_spanning_it(pooling):
    """No int overflow and no cost beyond prompt x (2 prompt - 1), whatever the kernel."""
    import torch

    from snapstream.snapkv import pool_votes

    votes = torch.rand(3, 40, generator=torch.Generator().manual_seed(0))
    assert torch.equal(pool_votes(votes, 2**32 - 1, pooling), pool_votes(votes, 79, pooling))


SINKLESS = CachePolicy(kind="snapstream", n_sink=0, n_topk=768, n_recent=256, observation=16,
                       kernel=31)


def test_a_request_of_the_defaults_kind_takes_the_defaults_fields():
    assert resolve_policy(SINKLESS, {}) == SINKLESS
    assert resolve_policy(SINKLESS, {"n_recent": 128}) == replace(SINKLESS, n_recent=128)


def test_streaming_asked_of_a_sinkless_default_keeps_its_own_sinks():
    policy = resolve_policy(SINKLESS, {"kind": "streaming"})
    assert policy.n_sink == KIND_OWN_FIELDS["streaming"]["n_sink"] == 4
    assert replace(policy, kind="snapstream", n_sink=0) == SINKLESS  # the rest: the default's
    assert resolve_policy(SINKLESS, {"kind": "streaming", "n_sink": 0}).n_sink == 0  # asked
    assert resolve_policy(SINKLESS, {"kind": "snapkv"}).n_sink == 0  # snapkv has no own sinks
    streaming_default = replace(SINKLESS, kind="streaming")
    assert resolve_policy(streaming_default, {}) == streaming_default  # the model's own choice


def test_resolving_names_a_bad_field():
    with pytest.raises(ValueError, match="kernel"):
        resolve_policy(SINKLESS, {"kind": "streaming", "kernel": 4})
