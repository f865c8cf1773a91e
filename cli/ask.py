"""`snapstream ask`: a question about a folder of source files (long-context code QA).

The files under each PATH that match ``--glob`` (hidden folders and ``__pycache__`` left out)
are read in path order, each under a header naming it, for as long as the prompt fits the
model's context with ``--max-new-tokens`` to spare; the files that do not fit are named. The
question follows them in one chat message. The answer prints, then what it cost: prompt
tokens, time to first token, decode speed, and the KV cache held against the full cache in
float16. With ``--draft-model`` (``auto``: the target's default draft) the target prefills only
the tokens the draft keeps (``--keep``), the question always among them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from cli.flags import add_policy_flags, add_sampling_flags, policy_from_args, sampling_from_args
from cli.generate import add_speculative_flags, draft_prompt, speculative_flags
from snapstream.chat import ChatMessage
from snapstream.checkpoints.registry import MODEL_HELP, draft_name, model_path
from snapstream.engine import Engine
from snapstream.kvcache import kv_bytes_per_token, pool_row_bytes
from snapstream.specprefill.pieces import Request
from snapstream.specprefill.settings import SpeculativeSettings
from snapstream.weight_formats import AUTO, DTYPE_CHOICES, DTYPE_HELP, KV_DTYPE_HELP, KV_DTYPES


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                        help="source files, or folders searched for --glob")
    parser.add_argument("--question", required=True, help="what to ask about the files")
    parser.add_argument("--glob", default="*.py",
                        help="file names to read in each folder, recursively (default *.py)")
    parser.add_argument("--model", default=None, help=MODEL_HELP)
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO, help=DTYPE_HELP)
    parser.add_argument("--kv-dtype", choices=KV_DTYPES, default=None, help=KV_DTYPE_HELP)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    add_policy_flags(parser)
    add_speculative_flags(parser)
    add_sampling_flags(parser)
    parser.add_argument("--json", action="store_true",
                        help="print the answer and its costs as one JSON object")


@dataclass(frozen=True)
class SourceText:
    path: Path
    block: str  # the file under its header, as the prompt holds it


def find_files(paths: list[Path], pattern: str) -> list[Path]:
    """The files ``paths`` name: each file as given, each folder's files matching ``pattern``
    (hidden folders and ``__pycache__`` skipped), in path order, each once. ValueError naming a
    path that does not exist, or when nothing matches."""
    found: dict[Path, None] = {}
    for path in paths:
        if path.is_file():
            found[path] = None
        elif path.is_dir():
            found |= dict.fromkeys(sorted(
                p for p in path.rglob(pattern) if p.is_file() and not any(
                    part.startswith(".") or part == "__pycache__"
                    for part in p.relative_to(path).parts[:-1])))
        else:
            raise ValueError(f"{path}: no such file or folder")
    if not found:
        raise ValueError(f"no file matches {pattern!r} under {', '.join(map(str, paths))}: "
                         f"change --glob or the paths")
    return list(found)


def read_sources(files: list[Path]) -> tuple[list[SourceText], list[Path]]:
    """The UTF-8 files as prompt blocks, and those that are not text (skipped)."""
    read, unreadable = [], []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            unreadable.append(path)
            continue
        read.append(SourceText(path, f"### {path}\n```\n{text.rstrip()}\n```\n"))
    return read, unreadable


def user_message(sources: list[SourceText], question: str) -> str:
    files = "\n".join(source.block for source in sources)
    return f"Here are source files.\n\n{files}\n{question_block(question)}"


def question_block(question: str) -> str:
    return f"Question: {question}"


def fit_sources(engine: Engine, sources: list[SourceText], question: str,
                max_new_tokens: int) -> tuple[list[SourceText], list[int]]:
    """The longest run of ``sources`` from the first whose chat prompt leaves
    ``max_new_tokens`` of the context, and that prompt's token ids. ValueError when not even
    the question fits."""
    limit = engine.context_len - max_new_tokens

    def ids_of(kept: list[SourceText]) -> list[int]:
        text = engine.tokenizer.render_chat([ChatMessage("user", user_message(kept, question))])
        return engine.tokenizer.encode(text)

    sizes = [len(engine.tokenizer.encode(source.block)) for source in sources]
    count, total = 0, len(ids_of([]))
    while count < len(sources) and total + sizes[count] <= limit:
        total, count = total + sizes[count], count + 1
    while True:  # the estimate sums the blocks alone; the whole prompt has the last word
        ids = ids_of(sources[:count])
        if len(ids) <= limit:
            return sources[:count], ids
        if count == 0:
            raise ValueError(f"the question alone takes {len(ids)} tokens; the model's context "
                             f"is {engine.context_len} with --max-new-tokens {max_new_tokens}")
        count -= 1


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    sources, unreadable = read_sources(find_files(args.paths, args.glob))
    given = speculative_flags(args)
    draft_model = draft_name(args.draft_model, args.model)
    if draft_model is not None:
        model_path(draft_model)  # not installed: one line, before the target loads
    engine = Engine.from_pretrained(args.model, dtype=args.dtype, kv_dtype=args.kv_dtype)
    if engine.tokenizer.chat_template is None:
        raise ValueError(f"{engine.name} has no chat template: ask an instruct model "
                         f"(--model qwen2.5-coder-1.5b)")
    kept, ids = fit_sources(engine, sources, args.question, args.max_new_tokens)
    policy = policy_from_args(args, engine.default_policy)
    prompt, positions, speculative = ids, None, None
    if given is not None:
        settings = replace(SpeculativeSettings.defaults_for(engine.config), **given)
        draft = Engine.from_pretrained(draft_model, dtype=args.dtype)
        request = Request((ChatMessage("user", user_message(kept, args.question)),),
                          is_chat=True)
        prompt, positions, speculative = draft_prompt(engine, draft, request,
                                                      question_block(args.question), settings)
        speculative = {"draft_model": draft_model} | speculative
    result = engine.generate(prompt, max_new_tokens=args.max_new_tokens, policy=policy,
                             sampling=sampling_from_args(args), positions=positions)
    layout = engine.model_layout(policy.layout(len(prompt), args.max_new_tokens))
    draft_s = speculative["draft_time_s"] if speculative else 0.0
    report = {
        "answer": result.text, "finish_reason": result.finish_reason,
        "files": [str(s.path) for s in kept],
        "left_out": [str(s.path) for s in sources[len(kept):]],
        "not_text": [str(p) for p in unreadable], "prompt_tokens": len(ids),
        "ttft_s": round(draft_s + result.ttft_s, 3), "new_tokens": len(result.token_ids),
        "decode_tokens_per_s": round((len(result.token_ids) - 1) / result.decode_s, 2)
        if result.decode_s > 0 else None,
        "policy": policy.kind, "kv_bytes": pool_row_bytes(engine.config, layout, engine.kv_dtype),
        "full_kv_bytes_f16": (len(ids) + args.max_new_tokens)
        * kv_bytes_per_token(engine.config, torch.float16),
    } | ({"speculative": speculative} if speculative else {})
    print(json.dumps(report) if args.json else describe(report, engine.context_len))
    return 0


def describe(report: dict, context_len: int) -> str:
    lines = [report["answer"].strip(), ""]
    left = report["left_out"]
    lines.append(f"files: {len(report['files'])} read ({report['prompt_tokens']:,} prompt "
                 f"tokens)" + (f", {len(left)} left out (the context holds {context_len:,} "
                               f"tokens): {', '.join(left[:5])}{' ...' if len(left) > 5 else ''}"
                               if left else "")
                 + (f"; not UTF-8 text: {len(report['not_text'])}" if report["not_text"] else ""))
    spec = report.get("speculative")
    kept = (f" (draft {spec['draft_model']} {spec['draft_time_s']:.1f} s, kept "
            f"{spec['kept_tokens']:,} of {spec['prompt_tokens']:,} tokens)" if spec else "")
    speed = report["decode_tokens_per_s"]
    lines.append(f"time to first token {report['ttft_s']:.2f} s{kept}; {report['new_tokens']} "
                 f"tokens" + (f" at {speed:.1f} tokens/s" if speed else ""))
    lines.append(f"KV cache {report['kv_bytes'] / 2**20:,.1f} MiB ({report['policy']}); the full "
                 f"cache in float16: {report['full_kv_bytes_f16'] / 2**20:,.1f} MiB")
    return "\n".join(lines)
