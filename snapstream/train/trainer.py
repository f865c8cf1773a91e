"""Training loop: deterministic from a seed, resumable from its last checkpoint, time-limited."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tqdm import tqdm

from snapstream.checkpoint import save_checkpoint
from snapstream.model import Transformer, causal_attend
from snapstream.train.batches import Batch, make_batch
from snapstream.train.config import PAD_ID, TOKENIZER, TrainConfig

STATE_FILE = "trainer_state.pt"


@dataclass(frozen=True)
class StepStats:
    loss: float
    answer_loss: float
    answer_accuracy: float  # fraction of answer bytes predicted exactly (teacher forced)
    # the same over each answer's first byte alone: the lookup itself. The later bytes copy on
    # from the first, so answer_accuracy can reach ~0.9 while the lookup is mostly wrong
    first_byte_accuracy: float
    tokens: int


def learning_rate(config: TrainConfig, step: int) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    floor = config.min_lr_fraction
    return config.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def loss_on(model: Transformer, batch: Batch, lm_weight: float) -> tuple[torch.Tensor, StepStats]:
    positions = torch.arange(batch.input_ids.shape[1])[None]
    with torch.autocast("cpu", dtype=torch.bfloat16):  # fp32 master weights, bf16 matmuls
        hidden = model(batch.input_ids, positions, causal_attend)  # (B, T, hidden)
    logits = model.logits(hidden.float())  # (B, T, V)
    per_token = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none")
    is_real = batch.targets != PAD_ID
    is_prompt = is_real & ~batch.is_answer
    answer_loss = per_token[batch.is_answer].mean()
    loss = answer_loss + lm_weight * per_token[is_prompt].mean()
    correct = logits.argmax(-1) == batch.targets  # (B, T)
    is_first = batch.is_answer & ~F.pad(batch.is_answer[:, :-1], (1, 0))  # (B, T)
    return loss, StepStats(loss.item(), answer_loss.item(),
                           correct[batch.is_answer].float().mean().item(),
                           correct[is_first].float().mean().item(), int(is_real.sum()))


RUN_LIMITS = ("time_limit_min", "checkpoint_every", "log_every")  # may change between resumes


def _identity(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in RUN_LIMITS}


class Trainer:
    def __init__(self, config: TrainConfig, out_dir: Path) -> None:
        self.config, self.out_dir = config, out_dir
        torch.manual_seed(config.seed)
        self.model = Transformer(config.model_config())
        self._init_weights()
        decay = [p for n, p in self.model.named_parameters() if p.dim() > 1]
        no_decay = [p for n, p in self.model.named_parameters() if p.dim() <= 1]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": config.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95))
        self.step = 0

    def _init_weights(self) -> None:
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                if param.dim() > 1:
                    std = 0.02 / math.sqrt(2 * self.config.num_layers) if name.endswith(
                        ("o_proj.weight", "down_proj.weight")) else 0.02
                    param.normal_(0.0, std)

    def save(self) -> None:
        save_checkpoint(self.model, self.out_dir, TOKENIZER, self.config.serving_policy)
        torch.save({"step": self.step, "optimizer": self.optimizer.state_dict(),
                    "config": self.config.to_dict()}, self.out_dir / STATE_FILE)

    def resume(self) -> bool:
        state_file = self.out_dir / STATE_FILE
        if not state_file.exists():
            return False
        state = torch.load(state_file, weights_only=False)
        if _identity(state["config"]) != _identity(self.config.to_dict()):
            raise ValueError(f"{self.out_dir} was trained with another configuration; "
                             "use a new --out directory or the same flags")
        weights = load_file(self.out_dir / "model.safetensors")
        self.model.load_state_dict(weights, strict=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = state["step"]
        return True

    def train(self) -> None:
        config = self.config
        self.out_dir.mkdir(parents=True, exist_ok=True)
        log = (self.out_dir / "train_log.jsonl").open("a")
        started, window_tokens, window_start = time.monotonic(), 0, time.monotonic()
        bar = tqdm(total=config.steps, initial=self.step, desc="train", unit="step")
        while self.step < config.steps:
            stats = self._train_step(make_batch(config, self.step))
            self.step += 1
            window_tokens += stats.tokens
            bar.update(1)
            bar.set_postfix(loss=f"{stats.loss:.3f}", ans_acc=f"{stats.answer_accuracy:.2f}",
                            first=f"{stats.first_byte_accuracy:.2f}")
            if self.step % config.log_every == 0:
                now = time.monotonic()
                log.write(json.dumps({"step": self.step, "loss": stats.loss,
                                      "answer_loss": stats.answer_loss,
                                      "answer_accuracy": stats.answer_accuracy,
                                      "first_byte_accuracy": stats.first_byte_accuracy,
                                      "lr": learning_rate(config, self.step - 1),
                                      "tokens_per_s": window_tokens / (now - window_start),
                                      "elapsed_s": now - started}) + "\n")
                log.flush()
                window_tokens, window_start = 0, now
            out_of_time = time.monotonic() - started > config.time_limit_min * 60
            if self.step % config.checkpoint_every == 0 or out_of_time:
                self.save()
            if out_of_time:
                bar.write(f"time limit of {config.time_limit_min} min reached at step {self.step}")
                break
        self.save()
        bar.close()

    def _train_step(self, batch: Batch) -> StepStats:
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.config, self.step)
        loss, stats = loss_on(self.model, batch, self.config.lm_weight)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return stats
