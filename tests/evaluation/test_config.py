"""EvalConfig: validation names the field; runs and samples cover the grid."""

from dataclasses import replace

import pytest

from evaldata import Placement
from evaluation import Budget, EvalConfig, SplitRule
from tests.evaldata.helpers import tiny_chat_tokenizer


def budgets(*labels: str) -> tuple[Budget, ...]:
    return tuple(Budget.parse(label) for label in labels)


@pytest.mark.parametrize(("field", "value"), [
    ("tasks", ()), ("tasks", ("passkey", "sudoku")), ("tasks", ("kv", "kv")),
    ("policies", ("full", "h2o")), ("policies", ()),
    ("placements", ("after", "middle")), ("placements", ("after", "after")),
    ("context_lens", (64,)), ("context_lens", ()),
    ("depths", (0.5, 1.5)), ("depths", ()),
    ("budgets", ()), ("budgets", budgets("1/4", "1/4")),
    ("n_per_cell", 0), ("limit", 0), ("prompt_format", "xml"), ("num_distractors", 99),
    ("num_hops", 0), ("num_values", 0), ("gaps", (-1,)), ("gaps", ()), ("gaps", (8, 8)),
    ("max_group_tokens", 100),
])
def test_bad_value_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        EvalConfig(**{field: value})


def test_gap_needs_the_question_after_the_context():
    with pytest.raises(ValueError, match="gaps need placements=after"):
        EvalConfig(gaps=(0, 64))
    assert EvalConfig(gaps=(0, 64), placements=("after",)).to_json()["gaps"] == [0, 64]


def test_budget_too_small_for_a_context():
    with pytest.raises(ValueError, match="budgets"):
        EvalConfig(context_lens=(128,), budgets=budgets("1/128"))


def test_full_alone_needs_no_budget():
    cfg = EvalConfig(policies=("full",), budgets=())
    assert [run.policy.kind for run in cfg.runs(1024)] == ["full"]


def test_runs_full_once_then_every_budget():
    cfg = EvalConfig(policies=("full", "streaming", "snapstream"),
                     budgets=budgets("1/4", "1/8", "100"), split_rule=SplitRule(observation=16))
    runs = cfg.runs(1024)
    assert [(r.policy.kind, r.budget_tokens) for r in runs] == [
        ("full", None), ("streaming", 256), ("streaming", 128), ("streaming", 100),
        ("snapstream", 256), ("snapstream", 128), ("snapstream", 100)]
    assert runs[0].budget is None
    assert {r.policy.observation for r in runs} == {16}


def test_samples_grid_and_limit_spread():
    cfg = EvalConfig(tasks=("passkey", "kv"), context_lens=(700,), depths=(0.0, 1.0),
                     n_per_cell=2, placements=("after", "before"))
    samples = cfg.samples(tiny_chat_tokenizer())
    assert len(samples) == 2 * 2 * 2
    assert cfg.placements == (Placement.AFTER, Placement.BEFORE)
    assert all(s.prompt.startswith("<|im_start|>") for s in samples)  # chat by default
    limited = replace(cfg, limit=2).samples(tiny_chat_tokenizer())
    assert [s.task for s in limited] == ["passkey", "kv"]
    assert [s.prompt for s in limited] == [samples[0].prompt, samples[4].prompt]


def test_samples_reproducible_from_seed():
    cfg = EvalConfig(tasks=("vartrack",), context_lens=(900,), depths=(0.5,), n_per_cell=2)
    tokenizer = tiny_chat_tokenizer()
    assert [s.prompt for s in cfg.samples(tokenizer)] == [s.prompt for s in cfg.samples(tokenizer)]
    other = replace(cfg, seed=1)
    assert [s.prompt for s in other.samples(tokenizer)] != [
        s.prompt for s in cfg.samples(tokenizer)]


def test_to_json_round_trips_the_grid():
    cfg = EvalConfig(budgets=budgets("1/2", "300"))
    data = cfg.to_json()
    assert data["budgets"] == ["1/2", "300"]
    assert data["placements"] == ["after", "before"]
    assert data["observation"] == 32 and data["recent_fraction"] == 0.25
