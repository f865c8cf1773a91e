"""Command-line flags shared by the commands that generate (``generate``, ``chat``): the cache
policy's and the sampling's (torch-free: ``chat --addr`` talks to a router)."""

from __future__ import annotations

import argparse

from snapstream.policy import (
    OBSERVES,
    POLICY_KINDS,
    POOLINGS,
    SIZE_FIELDS,
    UNITS,
    CachePolicy,
    resolve_policy,
)
from snapstream.sampling_params import SamplingParams

POLICY_FLAGS = ("policy", *SIZE_FIELDS, "pooling", "observe", "unit")


def add_policy_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per CachePolicy field; an unset flag keeps the model's default policy."""
    parser.add_argument("--policy", choices=sorted(POLICY_KINDS), default=None)
    for name in SIZE_FIELDS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    parser.add_argument("--pooling", choices=POOLINGS, default=None)
    parser.add_argument("--observe", choices=OBSERVES, default=None,
                        help="opening: SnapKV's window also reads the last turn's opening again "
                        "after the prompt (a question placed before its document)")
    parser.add_argument("--unit", choices=UNITS, default=None,
                        help="word: SnapKV keeps a word's tokens together (a number, an "
                        "identifier), each scoring the word's best")


def policy_from_args(args: argparse.Namespace, defaults: CachePolicy) -> CachePolicy:
    given = {name: getattr(args, name) for name in POLICY_FLAGS if getattr(args, name) is not None}
    if "policy" in given:
        given["kind"] = given.pop("policy")
    return resolve_policy(defaults, given)


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)


def sampling_from_args(args: argparse.Namespace, stop_token_ids=()) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          seed=args.seed, stop_token_ids=tuple(stop_token_ids))
