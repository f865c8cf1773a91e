"""Speculative prefill measured: a draft of one family cuts a document longer than the
target's window (``compact`` positions) against the obvious truncations at the same target
budget. (Time to first token: ``snapstream bench specprefill``; the grid of keep shares:
``snapstream eval --draft-model``.)

``python -m evaluation.speculative compact ...`` prints one table, ``... report DIR...`` the
grid's table across pairs with its figure, ``... chunks ...`` draws one prompt's kept tokens;
the figures in docs/accuracy.md and docs/speculative.md name their exact commands.
"""

from __future__ import annotations

import argparse
import random
import resource
from collections.abc import Callable
from pathlib import Path

from evaldata import (
    Placement,
    PromptSpec,
    Sample,
    TaskConfig,
    generate,
    model_format,
)
from evaluation.config import EvalConfig
from evaluation.speculative_report import (
    load_pairs,
    plot_accuracy_vs_keep,
    plot_kept_chunks,
    table,
)
from evaluation.speculative_runs import needle_kept, sample_request
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.sampling_params import SamplingParams
from snapstream.specprefill.pieces import Request, render_served
from snapstream.specprefill.selector import DraftSelector, pick
from snapstream.specprefill.settings import SpeculativeSettings

FULL = CachePolicy(kind="full")
GREEDY = SamplingParams(temperature=0.0)
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)


def keep_last(ids: list[int], budget: int) -> list[int]:
    return ids[-budget:]


def keep_first_and_last(ids: list[int], budget: int) -> list[int]:
    return ids[: budget // 2] + ids[-(budget - budget // 2):]


TRUNCATIONS: dict[str, Callable[[list[int], int], list[int]]] = {
    "last": keep_last, "first+last": keep_first_and_last}


def run_compact(args: argparse.Namespace) -> None:
    """One row per (sample, budget): the draft ranks a sample's chunks once for every budget.
    The samples are the eval sets' own at ``args.length`` target tokens (raw prompts)."""
    target, draft = Engine.from_pretrained(args.target), Engine.from_pretrained(args.draft)
    selector = DraftSelector(draft)
    names = [*TRUNCATIONS, "speculative"]
    wins = {(budget, name): 0 for budget in args.budgets for name in names}
    print(f"| task | depth | prompt tokens | draft tokens | budget | {' | '.join(names)} | "
          "speculative kept | needle kept | draft s | peak RSS GiB |")
    print(f"|---|---|---|---|---|{'---|' * len(names)}---|---|---|---|", flush=True)
    for i in range(args.first_sample, args.first_sample + args.samples):
        for task in args.tasks:
            depth = args.depths[i % len(args.depths)]
            sample = generate(task, random.Random(f"speculative/{args.seed}/{task}/{i}"),
                              TaskConfig(context_len=args.length, depth=depth,
                                         placement=args.placement),
                              PromptSpec(target.tokenizer, "raw"))
            prompt = sample.prompt
            ids, offsets = target.tokenizer.encode_with_offsets(prompt)
            request = Request.completion(prompt)
            ranking = selector.rank(request, SpeculativeSettings())
            for budget in args.budgets:
                # picked with "original" positions for the kept indices (is the needle kept?),
                # prefilled renumbered, as "compact" does
                selection = pick(ranking, render_served(target.tokenizer, request),
                                 target.tokenizer, SpeculativeSettings(
                                     keep=None, keep_tokens=budget),
                                 _always_kept_from(prompt, sample))
                kept = {name: cut(ids, budget) for name, cut in TRUNCATIONS.items()}
                kept["speculative"] = selection.ids
                right = {name: _answers(target, kept[name], sample, args.max_new_tokens)
                         for name in names}
                for name in names:
                    wins[budget, name] += right[name]
                marks = " | ".join("yes" if right[name] else "no" for name in names)
                needle = needle_kept(prompt, sample, offsets, selection.indices)
                print(f"| {task} | {depth} | {len(ids)} | {len(ranking.offsets)} | {budget} | "
                      f"{marks} | {len(selection.ids)} | {needle:.0%} | {ranking.draft_s:.1f} | "
                      f"{_peak_rss_gib():.2f} |",
                      flush=True)
    total = args.samples * len(args.tasks)
    for budget in args.budgets:
        counts = " | ".join(f"{wins[budget, n]}/{total}" for n in names)
        print(f"| **right** | | | | {budget} | {counts} | | | | |")


def _always_kept_from(prompt: str, sample: Sample) -> int:
    """Where the always-kept tail starts: the question after the context; the answer cue when
    the question comes before it (the question itself is then kept only where the draft ranks
    its chunk high enough)."""
    after = sample.placement is Placement.AFTER
    return prompt.rindex(sample.question) if after else prompt.rindex(sample.cue)


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _answers(target: Engine, ids: list[int], sample, max_new_tokens: int) -> bool:
    out = target.generate(ids, max_new_tokens, policy=FULL, sampling=GREEDY)
    return sample.is_correct(out.text)


def run_chunks(args: argparse.Namespace) -> None:
    """One grid sample (question after, the target's prompt format): the draft's kept tokens
    at each keep share drawn over it, the needle and the question marked."""
    target, draft = Engine.from_pretrained(args.target), Engine.from_pretrained(args.draft)
    cfg = EvalConfig(tasks=(args.task,), context_lens=(args.length,), depths=(args.depth,),
                     placements=(Placement.AFTER,), n_per_cell=1, seed=args.seed,
                     prompt_format=model_format(target.tokenizer))
    sample = cfg.samples(target.tokenizer)[0]
    request, view = sample_request(target, sample, cfg.prompt_format)
    text = view.text
    ranking = DraftSelector(draft).rank(request, SpeculativeSettings())
    _, offsets = target.tokenizer.encode_with_offsets(text)
    kept = {}
    for keep in args.keeps:
        selection = pick(ranking, view, target.tokenizer, SpeculativeSettings(keep=keep),
                         text.rindex(sample.question))
        mask = [False] * len(offsets)
        for i in selection.indices:
            mask[i] = True
        kept[keep] = mask
        print(f"keep {keep:g}: {len(selection.ids)}/{len(offsets)} target tokens, needle "
              f"{needle_kept(text, sample, offsets, selection.indices):.0%} kept")
    needle = next(n for n in sample.needles if n.is_target)
    marks = {"needle": _token_span(offsets, text.index(needle.text), len(needle.text)),
             "question": _token_span(offsets, text.rindex(sample.question),
                                     len(sample.question))}
    plot_kept_chunks(kept, marks, f"{args.draft} drafting for {args.target}: {args.task}, "
                     f"{len(offsets)} tokens, needle at depth {args.depth}", args.out)
    print(f"wrote {args.out}")


def _token_span(offsets: list[tuple[int, int]], start: int, length: int) -> tuple[int, int]:
    inside = [i for i, (a, b) in enumerate(offsets) if a < start + length and b > start]
    return inside[0], inside[-1] + 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m evaluation.speculative")
    commands = parser.add_subparsers(dest="command", required=True)
    compact = commands.add_parser("compact", help="a document longer than the target's window")
    compact.add_argument("--length", type=int, default=24000, help="prompt tokens (target's)")
    compact.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")],
                         default=[8000], help="target tokens kept")
    compact.add_argument("--tasks", type=lambda s: s.split(","), default=["niah"])
    compact.add_argument("--samples", type=int, default=3, help="per task")
    compact.add_argument("--first-sample", type=int, default=0,
                         help="index of the first sample (split a grid into runs)")
    compact.add_argument("--placement", type=Placement, default=Placement.AFTER)
    compact.add_argument("--depths", type=lambda s: [float(x) for x in s.split(",")],
                         default=list(DEPTHS), help="needle depths, cycled through")
    compact.add_argument("--max-new-tokens", type=int, default=12)
    compact.add_argument("--seed", type=int, default=0)
    chunks = commands.add_parser("chunks", help="the kept tokens of one prompt, drawn")
    chunks.add_argument("--task", default="niah")
    chunks.add_argument("--length", type=int, default=4096, help="context tokens (target's)")
    chunks.add_argument("--depth", type=float, default=0.5)
    chunks.add_argument("--keeps", type=lambda s: [float(x) for x in s.split(",")],
                        default=[0.1, 0.25, 0.5])
    chunks.add_argument("--seed", type=int, default=0)
    chunks.add_argument("--out", type=Path, default=Path("docs/img/speculative_kept_chunks.png"))
    report = commands.add_parser("report", help="the grid's table and figure across pairs")
    report.add_argument("dirs", nargs="+", type=Path,
                        help="eval --draft-model outputs (those of one pair are merged)")
    report.add_argument("--out", type=Path,
                        default=Path("docs/img/speculative_accuracy_vs_keep.png"))
    for sub in (compact, chunks):
        sub.add_argument("--target", default="smollm2-135m")
        sub.add_argument("--draft", default="gemma3-270m")
    args = parser.parse_args(argv)
    {"compact": run_compact, "chunks": run_chunks, "report": run_report}[args.command](args)


def run_report(args: argparse.Namespace) -> None:
    pairs = load_pairs(args.dirs)
    print(table(pairs))
    plot_accuracy_vs_keep(pairs, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
