"""`snapstream train`: train the embedded byte-level model on generated retrieval data."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(parser: argparse.ArgumentParser) -> None:
    from snapstream.train.config import TrainConfig

    defaults = TrainConfig()
    parser.add_argument("--out", type=Path, required=True, help="checkpoint directory")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--time-limit-min", type=float, default=defaults.time_limit_min)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--fresh", action="store_true",
                        help="start over even if --out holds a checkpoint (default: resume)")


def run(args: argparse.Namespace) -> int:
    import torch

    from snapstream.train.config import TrainConfig
    from snapstream.train.trainer import Trainer

    if args.threads:
        torch.set_num_threads(args.threads)
    config = TrainConfig(seed=args.seed, steps=args.steps, lr=args.lr,
                         time_limit_min=args.time_limit_min)
    trainer = Trainer(config, args.out)
    if not args.fresh and trainer.resume():
        print(f"resuming {args.out} at step {trainer.step}")
    trainer.train()
    print(f"checkpoint written to {args.out}")
    return 0
