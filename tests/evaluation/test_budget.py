"""Budgets as fractions or token counts, and the rule that splits one into a cache policy."""

from fractions import Fraction

import pytest

from evaluation.budget import Budget, SplitRule
from snapstream.policy import KIND_OWN_FIELDS, POLICY_KINDS


@pytest.mark.parametrize(("text", "fraction", "tokens"), [
    ("1/4", Fraction(1, 4), None), ("0.125", Fraction(1, 8), None), ("1/1", Fraction(1), None),
    ("256", None, 256), (" 64 ", None, 64),
])
def test_parse(text, fraction, tokens):
    budget = Budget.parse(text)
    assert (budget.fraction, budget.tokens, budget.label) == (fraction, tokens, text.strip())


@pytest.mark.parametrize("text", ["abc", "1/0", "0", "3/2", "-1/4", "0.0", ""])
def test_parse_rejects(text):
    with pytest.raises(ValueError, match="budgets"):
        Budget.parse(text)


def test_tokens_for_context():
    assert Budget.parse("1/4").tokens_for(2048) == 512
    assert Budget.parse("1/8").tokens_for(1000) == 125
    assert Budget.parse("300").tokens_for(2048) == 300


@pytest.mark.parametrize(("budget", "sink", "topk", "recent", "observation"), [
    (512, 4, 380, 128, 32),  # recent = budget / 4
    (256, 4, 188, 64, 32),
    (64, 4, 28, 32, 32),  # recent never below the observation window
    (36, 4, 0, 32, 32),
    (10, 4, 0, 6, 6),  # observation clamped to what the sinks leave
    (2, 1, 0, 1, 1),  # the smallest budget: one sink, a one-token ring
])
def test_split_rule(budget, sink, topk, recent, observation):
    policy = SplitRule().policy("snapstream", budget)
    assert (policy.n_sink, policy.n_topk, policy.n_recent, policy.observation) == (
        sink, topk, recent, observation)
    assert policy.budget == budget


@pytest.mark.parametrize("kind", [k for k in POLICY_KINDS if k != "full"])
@pytest.mark.parametrize("recent_fraction", [0.0, 0.1, 0.25, 0.5, 1.0])
def test_every_policy_holds_the_budget(kind, recent_fraction):
    rule = SplitRule(recent_fraction=recent_fraction)
    for budget in (2, 3, 7, 33, 100, 257, 1024):
        policy = rule.policy(kind, budget)
        assert policy.kind == kind
        assert policy.layout(prompt_len=4096, max_new_tokens=0).budget == budget
        assert policy.n_recent >= policy.observation


def test_full_ignores_the_budget():
    assert SplitRule().policy("full", 0) == SplitRule().policy("full", 512)


@pytest.mark.parametrize(("field", "value"), [
    ("n_sink", -1), ("observation", 0), ("recent_fraction", -0.1), ("recent_fraction", 1.5),
    ("kernel", 4), ("pooling", "median"),
])
def test_rule_validation_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        SplitRule(**{field: value})


def test_budget_too_small():
    with pytest.raises(ValueError, match="budgets"):
        SplitRule().policy("snapstream", 1)


def test_zero_recent_fraction_keeps_the_window_alone():
    policy = SplitRule(recent_fraction=0.0, observation=32).policy("snapstream", 256)
    assert (policy.n_sink, policy.n_topk, policy.n_recent) == (4, 220, 32)


def test_rule_from_a_policy_splits_its_own_budget_back():
    from snapstream.policy import CachePolicy

    policy = CachePolicy(n_sink=8, n_topk=760, n_recent=256, observation=64, kernel=15,
                         pooling="max")
    rule = SplitRule.from_policy(policy)
    assert rule.policy("snapstream", policy.budget) == policy
    assert rule.policy("snapstream", 512).n_recent == 128


def test_streaming_keeps_its_own_sinks_whatever_the_rules():
    for n_sink in (0, 16):
        streaming = SplitRule(n_sink=n_sink).policy("streaming", 512)
        snapstream = SplitRule(n_sink=n_sink).policy("snapstream", 512)
        assert streaming.n_sink == KIND_OWN_FIELDS["streaming"]["n_sink"] == 4
        assert snapstream.n_sink == n_sink
        assert streaming.budget == snapstream.budget == 512
