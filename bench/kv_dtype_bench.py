"""`snapstream bench kv-dtype`: the KV cache's dtypes against each other on the served model:
batch-1 (and batch-B) decode step time over a filled pool at one context, and the agreement of
each dtype's decode with a float32 KV cache on held-out prose prompts (greedy parity and KL).

Every prompt is prefilled once (float32 K/V from the served format's prompt forward), then
inserted into one pool per dtype, which quantizes or rounds it there, once; the decode of each
dtype is teacher-forced along float32's greedy tokens (KL and top-1 agreement per step) and also
run free (is its greedy sequence float32's?).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from bench.engine_bench import interleaved_medians, ours_stepper
from bench.report import command_line, markdown_table, parse_ints, publish
from evaldata import corpus
from serving.settings import add_model_setting
from snapstream.decode import Decoder
from snapstream.engine import Engine
from snapstream.kvcache import BatchCache
from snapstream.weight_formats import KV_DTYPES


def register(parser: argparse.ArgumentParser) -> None:
    add_model_setting(parser)
    parser.add_argument("--kv-dtypes", default="bfloat16,int8",
                        help=f"comma-separated, of {', '.join(KV_DTYPES)}; the first is the "
                             "timing baseline")
    parser.add_argument("--context", type=int, default=8192, help="tokens of the timed pool")
    parser.add_argument("--batches", type=parse_ints, default=(1,))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts (0: no parity)")
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--no-doc", action="store_true", help="print only")


def _dtypes(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    bad = [name for name in names if name not in KV_DTYPES]
    if bad or not names:
        raise ValueError(f"--kv-dtypes: give names of {', '.join(KV_DTYPES)}, got {text!r}")
    return names


def timing_rows(engine, names: list[str], args) -> list[list[str]]:
    layout = engine.default_policy.layout(args.context, 0)
    rows = []
    for batch in args.batches:
        steppers = {name: ours_stepper(engine.model, layout, batch, args.context,
                                       dtype=getattr(torch, name)) for name in names}
        with torch.no_grad():
            medians = interleaved_medians(steppers, args.steps, args.warmup)
        base = medians[names[0]]
        rows += [[str(batch), name, f"{medians[name] * 1e3:.2f}",
                  f"{medians[name] / base:.2f}x"] for name in names]
    return rows


def prose_prompts(engine, count: int, tokens: int, seed: int) -> list[list[int]]:
    prose, rng = corpus("prose"), random.Random(seed)
    prompts = []
    for _ in range(count):
        text = prose.window(prose.draw_start(rng), tokens * 8).text
        ids = engine.tokenizer.encode(text)[:tokens - 8]
        prompts.append(ids + engine.tokenizer.encode(" To sum up,"))
    return prompts


def _decoder(engine, result, name: str):
    """A batch-1 pool in KV dtype ``name`` holding ``result``'s cache (converted on insert)."""
    pool = BatchCache(engine.config, result.cache.layout, 1, getattr(torch, name))
    pool.insert(0, result.cache)
    return Decoder(engine.model, pool)


def _greedy(decoder, result, steps: int, forced: list[int] | None):
    """-> greedy tokens (steps,) and their logits (steps, V); ``forced``: feed these tokens
    instead of the decoder's own (teacher forcing)."""
    logits, tokens = [result.logits], [int(result.logits.argmax())]
    position = result.cache.next_position
    with torch.no_grad():
        for step in range(steps - 1):
            token = tokens[-1] if forced is None else forced[step]
            out = decoder.step(torch.tensor([token]), torch.tensor([position + step]))[0]
            logits.append(out)
            tokens.append(int(out.argmax()))
    return tokens, torch.stack(logits)


def parity_rows(engine, names: list[str], args) -> list[list[str]]:
    """Per dtype: top-1 agreement and KL(float32 || dtype) along float32's greedy tokens, and how
    many prompts' free-running greedy continuations equal float32's."""
    stats = {name: {"agree": 0, "steps": 0, "kl": [], "same": 0} for name in names}
    for ids in prose_prompts(engine, args.prompts, args.prompt_tokens, args.seed):
        result = engine.prefill(ids, engine.default_policy, args.new_tokens)
        ref_tokens, ref_logits = _greedy(_decoder(engine, result, "float32"), result,
                                         args.new_tokens, None)
        ref_logp = torch.log_softmax(ref_logits, -1)  # (T, V)
        for name in names:
            _, logits = _greedy(_decoder(engine, result, name), result, args.new_tokens,
                                ref_tokens)
            logp = torch.log_softmax(logits, -1)
            stat = stats[name]
            stat["kl"] += (ref_logp.exp() * (ref_logp - logp)).sum(-1).tolist()
            stat["agree"] += int((logits.argmax(-1) == ref_logits.argmax(-1)).sum())
            stat["steps"] += len(ref_tokens)
            own, _ = _greedy(_decoder(engine, result, name), result, args.new_tokens, None)
            stat["same"] += own == ref_tokens
    return [[name, f"{s['agree']}/{s['steps']}", f"{sum(s['kl']) / len(s['kl']):.2e}",
             f"{max(s['kl']):.2e}", f"{s['same']}/{args.prompts}"]
            for name, s in stats.items()]


def run(args: argparse.Namespace) -> int:
    names = _dtypes(args.kv_dtypes)
    torch.manual_seed(args.seed)
    engine = Engine.from_pretrained(args.model, kv_dtype="float32")
    policy = engine.default_policy
    body = [f"{engine.name}, default policy (budget {policy.budget}); shared machine.\n",
            f"Decode step over a pool filled to {args.context:,} tokens (median of "
            f"{args.steps} interleaved steps; ratios against {names[0]}):\n",
            markdown_table(["batch", "KV dtype", "ms / step", "vs " + names[0]],
                           timing_rows(engine, names, args))]
    if args.prompts:
        body += [f"\nAgainst a float32 KV cache, {args.prompts} held-out prose prompts of "
                 f"{args.prompt_tokens:,} tokens, {args.new_tokens} greedy tokens each "
                 "(teacher-forced along float32's tokens for agreement and KL):\n",
                 markdown_table(["KV dtype", "top-1 = float32's", "mean KL", "max KL",
                                 "greedy sequence = float32's"],
                                parity_rows(engine, names, args))]
    body.append(f"\n`{command_line()}`")
    publish("\n".join(body), "kv-dtype", None if args.no_doc else args.doc)
    return 0
