"""`snapstream generate`: one request through the in-process engine."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from cli.flags import add_policy_flags, add_sampling_flags, policy_from_args, sampling_from_args
from snapstream.chat import ChatMessage
from snapstream.checkpoints.registry import DRAFT_HELP, MODEL_HELP, draft_name, model_path
from snapstream.engine import Engine
from snapstream.specprefill.pieces import Request, render_served
from snapstream.specprefill.selector import DraftSelector
from snapstream.specprefill.settings import POSITION_MODES, SpeculativeSettings
from snapstream.weight_formats import AUTO, DTYPE_CHOICES, DTYPE_HELP, KV_DTYPE_HELP, KV_DTYPES


def parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--prompt-ids must be comma-separated integers, got {text!r}") from None


SPECULATIVE_FLAGS = ("keep", "keep_tokens", "chunk_size", "look_ahead", "positions")


def add_speculative_flags(parser: argparse.ArgumentParser) -> None:
    """Speculative prefill: ``--draft-model`` and one flag per SpeculativeSettings field (unset:
    its defaults)."""
    parser.add_argument("--draft-model", default=None, help=DRAFT_HELP)
    parser.add_argument("--keep", type=float, default=None,
                        help="share of the prompt's target tokens to prefill, in (0, 1]")
    parser.add_argument("--keep-tokens", type=int, default=None,
                        help="target tokens to prefill (instead of --keep)")
    parser.add_argument("--chunk-size", type=int, default=None, help="draft tokens per chunk")
    parser.add_argument("--look-ahead", type=int, default=None,
                        help="draft tokens decoded after the prompt to score with")
    parser.add_argument("--positions", choices=POSITION_MODES, default=None,
                        help="original: kept tokens at their prompt positions; compact: "
                             "renumbered (a prompt longer than the target's context); "
                             "default: compact for a target with sliding-window layers, "
                             "original otherwise")


def speculative_flags(args: argparse.Namespace) -> dict | None:
    """The speculative flags given (SpeculativeSettings' fields, checked: ValueError naming a
    bad one); None without --draft-model (ValueError when a speculative flag is given
    anyway). Unset ones take the target's defaults (:meth:`SpeculativeSettings.defaults_for`)."""
    given = {name: getattr(args, name) for name in SPECULATIVE_FLAGS
             if getattr(args, name) is not None}
    if args.draft_model is None:
        if given:
            flags = ", ".join(f"--{name.replace('_', '-')}" for name in given)
            raise ValueError(f"{flags} need(s) --draft-model")
        return None
    if "keep_tokens" in given:
        given.setdefault("keep", None)
    SpeculativeSettings(**given)
    return given


def draft_prompt(engine: Engine, draft: Engine, request: Request, keep_text: str | None,
                 settings: SpeculativeSettings) -> tuple[list[int], list[int], dict]:
    """Speculative prefill's prompt: the target's token ids the draft keeps of ``request``
    (all from the last occurrence of ``keep_text`` on are kept: the question), their positions,
    and what the selection did."""
    view = render_served(engine.tokenizer, request)
    keep_from = None if keep_text is None else view.text.rindex(keep_text)
    selection = DraftSelector(draft).select(request, view, engine.tokenizer, settings, keep_from)
    return selection.ids, selection.positions, {
        "kept_tokens": len(selection.ids), "prompt_tokens": selection.num_prompt_tokens,
        "kept_share": round(selection.kept_share, 4), "draft_time_s": round(selection.draft_s, 4),
        "skipped": selection.skipped, "positions": selection.position_mode}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help=MODEL_HELP)
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO, help=DTYPE_HELP)
    parser.add_argument("--kv-dtype", choices=KV_DTYPES, default=None, help=KV_DTYPE_HELP)
    parser.add_argument("--device", default="cpu")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text")
    prompt.add_argument("--prompt-ids", type=parse_ids, help="comma-separated token ids")
    prompt.add_argument("--prompt-file", type=Path, help="a UTF-8 file holding the prompt text")
    parser.add_argument("--chat", action="store_true",
                        help="send --prompt as a user message through the chat template")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    add_policy_flags(parser)
    add_speculative_flags(parser)
    add_sampling_flags(parser)
    parser.add_argument("--stop-token-ids", type=parse_ids, default=())
    parser.add_argument("--json", action="store_true",
                        help='print {"token_ids", "text", "finish_reason"} (and "speculative")')


def _prompt_text(args: argparse.Namespace) -> str | None:
    if args.prompt_file is None:
        return args.prompt
    try:
        return args.prompt_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--prompt-file: cannot read {args.prompt_file}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    text = _prompt_text(args)
    if args.chat and text is None:
        raise ValueError("--chat needs --prompt or --prompt-file (a user message), not "
                         "--prompt-ids")
    given = speculative_flags(args)
    if given is not None and text is None:
        raise ValueError("--draft-model needs --prompt or --prompt-file: the draft reads text")
    draft_model = draft_name(args.draft_model, args.model)
    if draft_model is not None:
        model_path(draft_model)  # not installed: one line, before the target loads
    engine = Engine.from_pretrained(args.model, dtype=args.dtype, device=args.device,
                                    kv_dtype=args.kv_dtype)
    settings = (None if given is None
                else replace(SpeculativeSettings.defaults_for(engine.config), **given))
    policy = policy_from_args(args, engine.default_policy)
    prompt = text if text is not None else args.prompt_ids
    if args.chat:
        prompt = engine.tokenizer.render_chat([ChatMessage("user", text)])
    positions, report = None, None
    if settings is not None:
        draft = Engine.from_pretrained(draft_model, dtype=args.dtype, device=args.device)
        request = (Request((ChatMessage("user", text),), is_chat=True) if args.chat
                   else Request.completion(text))
        prompt, positions, report = draft_prompt(engine, draft, request,
                                                 text if args.chat else None, settings)
        report = {"draft_model": draft_model} | report
    result = engine.generate(prompt, max_new_tokens=args.max_new_tokens, policy=policy,
                             sampling=sampling_from_args(args, args.stop_token_ids),
                             positions=positions)
    if args.json:
        out = {"token_ids": result.token_ids, "text": result.text,
               "finish_reason": result.finish_reason}
        print(json.dumps(out | ({"speculative": report} if report else {})))
    else:
        print(result.text)
    return 0
