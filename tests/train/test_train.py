"""Training is deterministic from its seed, resumable, and its schedule's batches all build."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from snapstream.train.batches import make_batch
from snapstream.train.config import Phase, TrainConfig
from snapstream.train.trainer import Trainer

TINY = dict(steps=4, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
            intermediate_size=64, context_len=1024, log_every=1, checkpoint_every=2,
            phases=(Phase(0.0, 640, 700, 2),))


def test_every_batch_of_the_default_schedule_builds():
    config = TrainConfig()
    for step in range(0, config.steps, 7):
        batch = make_batch(config, step)
        assert batch.is_answer.any(dim=1).all()
        assert batch.input_ids.shape[1] <= config.context_len


def test_same_seed_same_weights_and_resume_is_exact(tmp_path):
    config = TrainConfig(**TINY)
    Trainer(config, tmp_path / "a").train()
    Trainer(config, tmp_path / "b").train()
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)

    half = TrainConfig(**{**TINY, "steps": 4})
    interrupted = Trainer(half, tmp_path / "c")
    interrupted.config = TrainConfig(**{**TINY, "steps": 4, "time_limit_min": 0.0})
    interrupted.train()  # stops after one step on its time limit, checkpointing
    resumed = Trainer(half, tmp_path / "c")
    assert resumed.resume() and 0 < resumed.step < 4
    resumed.train()
    c = load_file(tmp_path / "c" / "model.safetensors")
    assert all(torch.equal(a[k], c[k]) for k in a)
    log = [json.loads(line) for line in (tmp_path / "a" / "train_log.jsonl").read_text().split(
        "\n") if line]
    assert [entry["step"] for entry in log] == [1, 2, 3, 4]


def test_answer_mask_covers_exactly_the_answers_and_followups_fit_the_row():
    from snapstream.data import TrainingMixture
    from snapstream.train.batches import encode_sample

    sample = next(s for s in TrainingMixture(seed=1).stream() if len(s.followups) >= 2)
    ids, is_answer = encode_sample(sample, max_tokens=10_000)
    answers = bytes(t for t, a in zip(ids, is_answer, strict=True) if a).decode()
    assert answers == "".join(a + "\n" for a in (sample.answer, *(a for _, a in sample.followups)))
    no_room = len(encode_sample(sample, max_tokens=10_000)[0]) - 1
    short, short_answer = encode_sample(sample, max_tokens=no_room)
    assert len(short) <= no_room and short_answer.count(True) < is_answer.count(True)
    assert bytes(short[1:]).decode().startswith(sample.prompt + sample.answer + "\n")



def test_a_phase_draws_only_its_tasks_and_names_unknown_ones():
    import pytest

    from snapstream.data.phrasing import PHRASES
    from snapstream.data.sample import Split

    config = TrainConfig(**{**TINY, "phases": (Phase(0.0, 300, 320, 3, tasks=("kv",)),)})
    intros = PHRASES["kv"][Split.TRAIN].intros
    for row in make_batch(config, 0).input_ids.tolist():
        text = bytes(t for t in row if t < 256).decode()
        assert any(intro in text for intro in intros), text
    with pytest.raises(ValueError, match="sudoku"):
        TrainConfig(**{**TINY, "phases": (Phase(0.0, 300, 320, 3, tasks=("sudoku",)),)})


def test_a_phase_too_short_for_its_tasks_fails_when_configured_not_when_reached():
    # the default curriculum's second phase until 2026-11-23: a multikey sample with two
    # distractors, the longest wording and the longest keys needs 317 bytes, and a batch of
    # that phase could hold prompts of 304
    passkey = Phase(0.0, 200, 256, 32, max_distractors=0, max_hops=1, tasks=("passkey",))
    short = Phase(0.33, 320, 512, 20, max_distractors=2, max_hops=1)
    with pytest.raises(ValueError, match=r"phases\[1\] \(min_len 320;.*multikey .*needs 317"):
        TrainConfig(phases=(passkey, short))
    TrainConfig(phases=(passkey, Phase(0.33, 333, 512, 20, max_distractors=2, max_hops=1)))


class _Oracle(torch.nn.Module):
    """Predicts every target byte except each answer's first: a copy without a lookup."""

    def __init__(self, targets: torch.Tensor, wrong: torch.Tensor) -> None:
        super().__init__()
        self.targets, self.wrong = targets, wrong

    def forward(self, input_ids, positions, attend) -> torch.Tensor:
        return torch.zeros(*input_ids.shape, 1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        predicted = torch.where(self.wrong, (self.targets + 1) % 264, self.targets)
        return torch.nn.functional.one_hot(predicted, 264).float() * 10


def test_first_byte_accuracy_scores_the_lookup_apart_from_the_copy():
    from torch.nn.functional import pad

    from snapstream.train.trainer import loss_on

    batch = make_batch(TrainConfig(**TINY), 0)
    first = batch.is_answer & ~pad(batch.is_answer[:, :-1], (1, 0))
    _, stats = loss_on(_Oracle(batch.targets, first), batch, lm_weight=1.0)
    assert stats.first_byte_accuracy == 0.0
    expected = 1 - first.sum().item() / batch.is_answer.sum().item()
    assert stats.answer_accuracy == pytest.approx(expected)
