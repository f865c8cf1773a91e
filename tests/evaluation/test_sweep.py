"""The policy sweep: its variants, the choice from a table, the policy file it writes."""

import csv
import json
from dataclasses import asdict, replace

import pytest

from evaluation.budget import SplitRule
from evaluation.sweep import (
    AXES,
    BASE,
    GEN_AXES,
    GEN_SLACK,
    MAX_ROUNDS,
    axis_variants,
    choose,
    choose_generation,
    choose_kernel,
    generation_variants,
    kernel_variants,
    main,
    policy_fields,
    sweep_runs,
)
from snapstream.policy import CachePolicy
from tests.tiny_models import write_tiny_model


def test_variants_cross_kernel_and_pooling_and_vary_other_axes_alone():
    found = kernel_variants() + axis_variants(BASE)
    crossed = [v.rule for v in found if v.axis == "kernel x pooling"]
    assert len(crossed) == len(AXES["kernel"]) * len(AXES["pooling"])
    for axis in ("kernel", "observation", "n_sink", "recent_fraction"):
        rules = [v.rule for v in found if v.axis == axis]
        assert sorted(getattr(r, axis) for r in rules) == sorted(AXES[axis])
        assert all(replace(r, **{axis: getattr(BASE, axis)}) == BASE for r in rules)


def test_a_round_is_centred_on_its_centre_and_skips_what_was_decoded():
    centre = replace(BASE, kernel=15, pooling="max")
    done = frozenset(run.policy for run in sweep_runs(kernel_variants(), 2048))
    second = sweep_runs(axis_variants(centre), 2048, with_full=False, skip=done)
    assert second and not {run.policy for run in second} & done
    assert all(run.policy.pooling == "max" for run in second)
    assert all(run.policy.kind == "snapstream" for run in second)
    # the kernel axis at the centre's observation window, sinks and ring was decoded in the first
    # stage
    assert all(run.policy.kernel == 15 for run in second)


def entry(axis: str, mean: float, forced_nll: float | None = None, **fields) -> dict:
    rule = {"n_sink": BASE.n_sink, "observation": BASE.observation,
            "recent_fraction": BASE.recent_fraction,
            "kernel": BASE.kernel, "pooling": BASE.pooling, **fields}
    return {"stage": 1, "axis": axis, **rule, "1/4": mean, "1/8": mean, "mean": mean,
            "correct": round(mean * 20), "forced_nll": forced_nll}


def test_the_kernel_stage_takes_the_best_kernel_and_pooling():
    table = [entry("kernel x pooling", 0.5), entry("kernel x pooling", 0.8, kernel=15),
             entry("kernel x pooling", 0.9, kernel=31, pooling="max")]
    chosen = choose_kernel(table)
    assert (chosen.kernel, chosen.pooling) == (31, "max")
    assert replace(chosen, kernel=BASE.kernel, pooling=BASE.pooling) == BASE


def test_choose_takes_each_axis_best_and_the_centre_on_ties():
    centre = replace(BASE, kernel=31, pooling="max")
    table = [entry("kernel", 0.5, kernel=31), entry("kernel", 0.5, kernel=15),
             entry("observation", 0.6), entry("observation", 0.6, observation=64),
             entry("n_sink", 0.4), entry("n_sink", 0.7, n_sink=16),
             entry("recent_fraction", 0.5), entry("recent_fraction", 0.9, recent_fraction=0.0)]
    chosen = choose(table, centre)
    assert (chosen.kernel, chosen.observation, chosen.n_sink, chosen.recent_fraction) == (
        31, BASE.observation, 16, 0.0)
    assert chosen.pooling == "max"


def test_the_generation_stage_moves_only_the_sinks_and_the_ring():
    centre = replace(BASE, kernel=31, observation=16)
    found = generation_variants(centre)
    assert {v.axis for v in found} == set(GEN_AXES)
    assert all(replace(v.rule, n_sink=centre.n_sink, recent_fraction=centre.recent_fraction)
               == centre for v in found)


def test_the_generation_stage_takes_the_best_predicted_text_within_the_slack():
    centre = replace(BASE, kernel=31, observation=16, recent_fraction=0.125)
    best = 0.8
    table = [entry("n_sink", 0.5, 2.0, n_sink=4), entry("n_sink", 0.5, 2.0, n_sink=16),
             entry("recent_fraction", best, 3.0, recent_fraction=0.0),
             entry("recent_fraction", best - GEN_SLACK / 20, 2.5, recent_fraction=0.125),
             entry("recent_fraction", best - GEN_SLACK / 20, 2.2, recent_fraction=0.25),
             entry("recent_fraction", best - (GEN_SLACK + 1) / 20, 1.9, recent_fraction=0.5)]
    chosen = choose_generation(table, centre)
    # the ring: 1/2 predicts best but lost too many answers; of the rest 1/4 predicts best
    assert chosen.recent_fraction == 0.25
    assert chosen.n_sink == centre.n_sink == 4  # a tie goes to the centre's
def test_policy_fields_load_as_a_policy_of_the_serving_budget():
    policy = CachePolicy(**policy_fields(BASE))
    assert policy.kind == "snapstream" and policy.budget == 1024
    assert (policy.n_sink, policy.n_recent, policy.kernel) == (4, 256, 7)


@pytest.mark.timeout(600)
def test_sweep_runs_end_to_end_and_writes_the_policy_file(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "tiny")
    # a field the sweep does not search stays; one it does is replaced
    (model / "snapstream_policy.json").write_text('{"unit": "word", "kernel": 99}')
    assert main(["--model", str(model), "--tasks", "niah", "--context-lens", "700",
                 "--n-per-cell", "1", "--gen-context-len", "600", "--gen-gaps", "0,40",
                 "--gen-n-per-cell", "1", "--out", str(tmp_path / "out"),
                 "--write-policy"]) == 0
    result = json.loads((tmp_path / "out" / "sweep.json").read_text())
    rounds = max(e["stage"] for e in result["table"]) - 1
    assert 1 <= rounds <= MAX_ROUNDS and len(result["centres"]) == rounds
    assert len(result["table"]) == (len(kernel_variants()) + rounds * len(axis_variants(BASE))
                                    + len(generation_variants(BASE)))
    assert all(0.0 <= e["mean"] <= 1.0 for e in result["table"])
    assert 0.0 <= result["full_accuracy"] <= 1.0
    assert result["generation"]["gaps"] == [0, 40]
    assert 0.0 <= result["generation"]["full"]["accuracy"] <= 1.0
    assert result["generation"]["full"]["forced_nll"] > 0
    last = [e for e in result["table"] if e["stage"] == rounds]
    descent = choose(last, SplitRule(**result["centres"][-1]))
    assert asdict(descent) == result["descent"]
    # the descent stops when a round's pick is its own centre, or after MAX_ROUNDS
    assert rounds == MAX_ROUNDS or asdict(descent) == result["centres"][-1]
    generation = [e for e in result["table"] if e["stage"] == rounds + 1]
    assert all(e["gaps"] == [0, 40] for e in generation)
    assert all(e["forced_nll"] > 0 for e in generation)
    chosen = choose_generation(generation, descent)
    assert asdict(chosen) == result["chosen"]
    assert replace(chosen, n_sink=descent.n_sink,
                   recent_fraction=descent.recent_fraction) == descent
    with (tmp_path / "out" / "results.csv").open() as f:
        gaps = {row["gap"] for row in csv.DictReader(f)}
    assert gaps == {"0", "40"}  # the generation stage's rows are kept
    written = json.loads((model / "snapstream_policy.json").read_text())
    assert result["policy"] == policy_fields(chosen)
    assert written == {**result["policy"], "unit": "word"}
    assert (tmp_path / "out" / "sweep.png").read_bytes().startswith(b"\x89PNG")
    assert "wrote the model's default policy" in capsys.readouterr().out
