"""Toy associative recall (MQAR) at byte level with the shipped model's width and optimiser.

Each row: P pairs ``key:VAL`` (keys of KEYLEN lowercase letters, values of 4 upper-case
letters or digits), ``|``, then min(P, QUERIES) queries ``key?VAL``; SEP=: makes them
``key:VAL``, the pair repeated (recall by induction, as with a RULER answer prefix that restates
the key). LOSS=lm: language-model loss on every byte; LOSS=answer: the trainer's loss (mean over
the queried values' bytes plus mean over the rest). PAIRS is a curriculum ``P:STEPS,...,P``: P
pairs for STEPS steps, then the next stage; the last runs to the end (``8``: 8 pairs
throughout). Prints the accuracy of each queried value's first byte (chance ~0.03) every EVERY
steps.

  LR=1e-3 EVERY=50 PAIRS=8 QUERIES=4 SEP=? LOSS=lm THREADS=2 \
    python docs/probes/toy_mqar.py LAYERS KEYLEN STEPS
"""

import os
import random
import sys
import time

import torch
import torch.nn.functional as F

from snapstream.model import causal_attend
from snapstream.train.batches import Batch
from snapstream.train.config import PAD_ID, TrainConfig
from snapstream.train.trainer import Trainer, loss_on

torch.set_num_threads(int(os.environ.get("THREADS", "2")))
layers, key_len, steps = map(int, sys.argv[1:4])
every = int(os.environ.get("EVERY", "50"))
*stages, last = os.environ.get("PAIRS", "8").split(",")
schedule = [int(p) for stage in stages for p, n in [stage.split(":")] for _ in range(int(n))]
queries = int(os.environ.get("QUERIES", "4"))
loss_kind, sep = os.environ.get("LOSS", "lm"), os.environ.get("SEP", "?")
if loss_kind not in ("lm", "answer"):
    sys.exit(f"LOSS must be lm or answer, got {loss_kind!r}")
trainer = Trainer(TrainConfig(num_layers=layers), None)
model, optimizer = trainer.model, trainer.optimizer
for group in optimizer.param_groups:
    group["lr"] = float(os.environ.get("LR", "1e-3"))
LOWER, UPPER = "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def row(rng: random.Random, pairs: int) -> tuple[list[int], list[int]]:
    """Token ids (BOS first) and the text offsets of each queried value's first byte."""
    keys: list[str] = []
    while len(keys) < pairs:
        key = "".join(rng.choices(LOWER, k=key_len))
        keys += [key] if key not in keys else []
    values = ["".join(rng.choices(UPPER, k=4)) for _ in keys]
    text = " ".join(f"{k}:{v}" for k, v in zip(keys, values, strict=True)) + " |"
    firsts = []
    for q in rng.sample(range(pairs), min(pairs, queries)):
        text += f" {keys[q]}{sep}"
        firsts.append(len(text))
        text += values[q]
    return [256, *text.encode()], firsts


def lm_loss(batch: Batch) -> tuple[torch.Tensor, float]:
    """Language-model loss on every byte, and the queried values' first-byte accuracy."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model(batch.input_ids, torch.arange(batch.input_ids.shape[1])[None],
                       causal_attend)  # (B, T, hidden)
    logits = model.logits(hidden.float())  # (B, T, V)
    loss = F.cross_entropy(logits.transpose(1, 2), batch.targets, ignore_index=PAD_ID)
    is_first = batch.is_answer & ~F.pad(batch.is_answer[:, :-1], (1, 0))  # (B, T)
    correct = logits.argmax(-1) == batch.targets  # (B, T)
    return loss, correct[is_first].float().mean().item()


def answer_loss(batch: Batch) -> tuple[torch.Tensor, float]:
    """The trainer's loss (answer bytes and the rest, weighted equally) and first-byte accuracy."""
    loss, stats = loss_on(model, batch, lm_weight=1.0)
    return loss, stats.first_byte_accuracy


LOSSES = {"lm": lm_loss, "answer": answer_loss}
started = time.monotonic()
for step in range(steps):
    rng = random.Random(f"mqar/{step}")
    pairs = schedule[step] if step < len(schedule) else int(last)
    rows = [row(rng, pairs) for _ in range(32)]
    ids = torch.full((len(rows), max(len(r) for r, _ in rows)), PAD_ID)  # (B, T + 1)
    is_answer = torch.zeros_like(ids[:, 1:], dtype=torch.bool)  # (B, T): target is a value byte
    for i, (r, fs) in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        for j in fs:  # position j predicts text byte j (ids[j + 1])
            is_answer[i, j:j + 4] = True
    loss, first_byte = LOSSES[loss_kind](Batch(ids[:, :-1], ids[:, 1:], is_answer))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    if step % every == 0 or step == steps - 1:
        print(step, round(time.monotonic() - started), pairs, round(loss.item(), 3),
              "first-byte", round(first_byte, 3), flush=True)
