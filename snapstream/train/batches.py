"""Deterministic training batches: batch ``step`` depends only on (seed, step)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from snapstream.data import Sample
from snapstream.train.config import PAD_ID, TOKENIZER, TrainConfig


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # (B, T)
    targets: torch.Tensor  # (B, T), PAD_ID where no loss
    is_answer: torch.Tensor  # (B, T) bool: target is an answer byte (or its terminator)


def encode_sample(sample: Sample, max_tokens: int) -> tuple[list[int], list[bool]]:
    """The sample's training tokens (BOS first) and, per token, whether it is an answer byte;
    follow-ups that would take the row past ``max_tokens`` are left out."""
    ids = TOKENIZER.encode("")  # [BOS]
    is_answer = [False] * len(ids)
    segments = sample.training_segments()
    for i in range(0, len(segments), 2):  # (cue or prompt, answer) pairs
        encoded = [list(text.encode()) for text, _ in segments[i:i + 2]]
        if i and len(ids) + sum(map(len, encoded)) > max_tokens:
            break
        for tokens, (_, answer) in zip(encoded, segments[i:i + 2], strict=True):
            ids += tokens
            is_answer += [answer] * len(tokens)
    return ids, is_answer


def make_batch(config: TrainConfig, step: int) -> Batch:
    phase = config.phase_at(step)
    rng = random.Random(f"train/{config.seed}/{step}")
    length = rng.randint(phase.min_len, phase.max_len)
    mixture = phase.mixture(config.task_weights, seed=config.seed * 1_000_003 + step,
                            length=length)
    rows = [encode_sample(mixture[i], config.context_len + 1) for i in range(phase.batch_size)]
    width = max(len(ids) for ids, _ in rows) - 1
    input_ids = torch.full((len(rows), width), PAD_ID)
    targets = torch.full((len(rows), width), PAD_ID)
    is_answer = torch.zeros((len(rows), width), dtype=torch.bool)
    for row, (ids, answer) in enumerate(rows):
        n = len(ids) - 1
        input_ids[row, :n] = torch.tensor(ids[:-1])
        targets[row, :n] = torch.tensor(ids[1:])
        is_answer[row, :n] = torch.tensor(answer[1:])
    return Batch(input_ids, targets, is_answer)
