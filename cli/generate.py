"""`snapstream generate`: one request through the in-process engine."""

from __future__ import annotations

import argparse
import json

from snapstream.checkpoints.registry import MODEL_HELP
from snapstream.policy import POLICY_KINDS, POOLINGS, SIZE_FIELDS, CachePolicy, resolve_policy
from snapstream.sampling_params import SamplingParams
from snapstream.weight_formats import AUTO, DTYPE_CHOICES, DTYPE_HELP


def parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--prompt-ids must be comma-separated integers, got {text!r}") from None


POLICY_FLAGS = ("policy", *SIZE_FIELDS, "pooling")


def add_policy_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per CachePolicy field; an unset flag keeps the model's default policy."""
    parser.add_argument("--policy", choices=sorted(POLICY_KINDS), default=None)
    for name in SIZE_FIELDS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    parser.add_argument("--pooling", choices=POOLINGS, default=None)


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


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help=MODEL_HELP)
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO, help=DTYPE_HELP)
    parser.add_argument("--device", default="cpu")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text")
    prompt.add_argument("--prompt-ids", type=parse_ids, help="comma-separated token ids")
    parser.add_argument("--chat", action="store_true",
                        help="send --prompt as a user message through the chat template")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    add_policy_flags(parser)
    add_sampling_flags(parser)
    parser.add_argument("--stop-token-ids", type=parse_ids, default=())
    parser.add_argument("--json", action="store_true", help='print {"token_ids", "text"}')


def run(args: argparse.Namespace) -> int:
    from snapstream.chat import ChatMessage
    from snapstream.engine import Engine

    if args.chat and args.prompt is None:
        raise ValueError("--chat needs --prompt (a user message), not --prompt-ids")
    engine = Engine.from_pretrained(args.model, dtype=args.dtype, device=args.device)
    policy = policy_from_args(args, engine.default_policy)
    prompt = args.prompt if args.prompt is not None else args.prompt_ids
    if args.chat:
        prompt = engine.tokenizer.render_chat([ChatMessage("user", args.prompt)])
    result = engine.generate(prompt, max_new_tokens=args.max_new_tokens, policy=policy,
                             sampling=sampling_from_args(args, args.stop_token_ids))
    if args.json:
        print(json.dumps({"token_ids": result.token_ids, "text": result.text,
                          "finish_reason": result.finish_reason}))
    else:
        print(result.text)
    return 0
