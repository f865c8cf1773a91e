"""Deterministic training batches: batch ``step`` depends only on (seed, step)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from snapstream.data import TrainingMixture
from snapstream.train.config import PAD_ID, TOKENIZER, TrainConfig


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # (B, T)
    targets: torch.Tensor  # (B, T), PAD_ID where no loss
    is_answer: torch.Tensor  # (B, T) bool: target is an answer byte (or its terminator)


def encode_sample(prompt: str, target: str) -> tuple[list[int], list[int]]:
    prompt_ids = TOKENIZER.encode(prompt)
    return prompt_ids, list(target.encode())


def make_batch(config: TrainConfig, step: int) -> Batch:
    phase = config.phase_at(step)
    rng = random.Random(f"train/{config.seed}/{step}")
    length = rng.randint(phase.min_len, phase.max_len)
    mixture = TrainingMixture(seed=config.seed * 1_000_003 + step, weights=config.task_weights,
                              context_len_range=(length - 16, length),
                              max_distractors=phase.max_distractors, max_hops=phase.max_hops)
    pairs = [encode_sample(s.prompt, s.target) for s in
             (mixture[i] for i in range(phase.batch_size))]
    width = max(len(p) + len(a) for p, a in pairs) - 1
    input_ids = torch.full((len(pairs), width), PAD_ID)
    targets = torch.full((len(pairs), width), PAD_ID)
    is_answer = torch.zeros((len(pairs), width), dtype=torch.bool)
    for row, (prompt_ids, answer_ids) in enumerate(pairs):
        seq = prompt_ids + answer_ids
        input_ids[row, : len(seq) - 1] = torch.tensor(seq[:-1])
        targets[row, : len(seq) - 1] = torch.tensor(seq[1:])
        is_answer[row, len(prompt_ids) - 1 : len(seq) - 1] = True
    return Batch(input_ids, targets, is_answer)
