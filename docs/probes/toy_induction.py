"""Toy induction: 48 random letters or digits, repeated twice more, with the shipped model's
width and optimiser. Prints the accuracy on the second and third copies every 25 steps.

  python docs/probes/toy_induction.py LAYERS LR
"""

import random
import sys
import time

import torch
import torch.nn.functional as F

from snapstream.model import causal_attend
from snapstream.train.config import TrainConfig
from snapstream.train.trainer import Trainer

torch.set_num_threads(2)
layers, lr = int(sys.argv[1]), float(sys.argv[2])
trainer = Trainer(TrainConfig(num_layers=layers, lr=lr), None)
model, optimizer = trainer.model, trainer.optimizer
for group in optimizer.param_groups:
    group["lr"] = lr
ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
SPAN = 48

started = time.monotonic()
for step in range(400):
    rng = random.Random(f"ind/{step}")
    spans = [bytes(rng.choice(ALPHABET) for _ in range(SPAN)) for _ in range(32)]
    ids = torch.tensor([[256, *(s + b" " + s + b" " + s)] for s in spans])  # (B, T)
    x, y = ids[:, :-1], ids[:, 1:]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model(x, torch.arange(x.shape[1])[None], causal_attend)  # (B, T, hidden)
    logits = model.logits(hidden.float())  # (B, T, V)
    loss = F.cross_entropy(logits.transpose(1, 2), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    if step % 25 == 0:
        copies = (logits.argmax(-1) == y)[:, SPAN + 12 :].float().mean().item()
        print(step, round(time.monotonic() - started), round(loss.item(), 3),
              "accuracy on the copies", round(copies, 3), flush=True)
