"""Speculative prefill measured: a draft of one family cuts a document longer than the
target's window (``compact`` positions) against the obvious truncations at the same target
budget. (Time to first token: ``snapstream bench specprefill``; the grid of keep shares:
``snapstream eval --draft-model``.)

``python -m evaluation.speculative compact ...`` prints one table; the figures in
docs/accuracy.md name its exact command.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable

from evaldata import PromptSpec, Sample, TaskConfig, corpus, generate, verdict
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.sampling_params import SamplingParams
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


BASE_LEN = 8192  # the evaluation sets' prompts stop short of 24k tokens: one is widened


def long_sample(task: str, rng: random.Random, length: int, depth: float,
                spec: PromptSpec) -> tuple[Sample, str]:
    """A ``task`` sample of ``BASE_LEN`` tokens widened to about ``length`` with more of the
    same prose filler on both sides of its needle (``depth`` of it before, so the needle stays
    near ``depth``) -> the sample and its widened prompt."""
    sample = generate(task, rng, TaskConfig(context_len=BASE_LEN, depth=depth), spec)
    needle = next(n for n in sample.needles if n.is_target)
    start, end = needle.offset, needle.offset + len(needle.text)
    prose, prompt = corpus("prose"), sample.prompt
    starts = (prose.draw_start(rng), prose.draw_start(rng))
    extra = round((length - sample.num_tokens) * len(prompt) / sample.num_tokens)
    for _ in range(2):  # the second pass corrects the prose's own characters per token
        before = prose.window(starts[0], round(extra * depth)).text
        after = prose.window(starts[1], extra - len(before)).text
        widened = f"{prompt[:start]}{before} {prompt[start:end]} {after}{prompt[end:]}"
        added = spec.count(widened) - sample.num_tokens
        extra = round(extra * (length - sample.num_tokens) / added)
    return sample, widened


def run_compact(args: argparse.Namespace) -> None:
    """One row per (sample, budget): the draft ranks a sample's chunks once for every budget."""
    target, draft = Engine.from_pretrained(args.target), Engine.from_pretrained(args.draft)
    selector = DraftSelector(draft)
    names = [*TRUNCATIONS, "speculative"]
    wins = {(budget, name): 0 for budget in args.budgets for name in names}
    print(f"| task | depth | prompt tokens | budget | {' | '.join(names)} | needle kept | "
          "draft s |")
    print(f"|---|---|---|---|{'---|' * len(names)}---|---|", flush=True)
    for i in range(args.samples):
        for task in args.tasks:
            depth = DEPTHS[i % len(DEPTHS)]
            sample, prompt = long_sample(
                task, random.Random(f"speculative/{args.seed}/{task}/{i}"), args.length, depth,
                PromptSpec(target.tokenizer, "raw"))
            ids, offsets = target.tokenizer.encode_with_offsets(prompt)
            ranking = selector.rank(prompt, SpeculativeSettings())
            for budget in args.budgets:
                # picked with "original" positions for the kept indices (is the needle kept?),
                # prefilled renumbered, as "compact" does
                selection = pick(ranking, target.tokenizer, SpeculativeSettings(
                    keep=None, keep_tokens=budget), prompt.rindex(sample.question))
                kept = {name: cut(ids, budget) for name, cut in TRUNCATIONS.items()}
                kept["speculative"] = selection.ids
                right = {name: _answers(target, kept[name], sample, args.max_new_tokens)
                         for name in names}
                for name in names:
                    wins[budget, name] += right[name]
                marks = " | ".join("yes" if right[name] else "no" for name in names)
                needle = _needle_kept(prompt, sample, offsets, selection.positions)
                print(f"| {task} | {depth} | {len(ids)} | {budget} | {marks} | {needle:.0%} | "
                      f"{ranking.draft_s:.0f} |", flush=True)
    total = args.samples * len(args.tasks)
    for budget in args.budgets:
        counts = " | ".join(f"{wins[budget, n]}/{total}" for n in names)
        print(f"| **right** | | | {budget} | {counts} | | |")


def _needle_kept(prompt: str, sample: Sample, offsets: list[tuple[int, int]],
                 kept: list[int]) -> float:
    """Share of the target needle's target tokens the selection kept."""
    needle = next(n for n in sample.needles if n.is_target)
    start = prompt.index(needle.text)
    inside = [i for i, (a, b) in enumerate(offsets)
              if a < start + len(needle.text) and b > start]
    return len(set(inside) & set(kept)) / len(inside)


def _answers(target: Engine, ids: list[int], sample, max_new_tokens: int) -> bool:
    out = target.generate(ids, max_new_tokens, policy=FULL, sampling=GREEDY)
    return bool(verdict(sample.answers, out.text, is_final=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m evaluation.speculative")
    commands = parser.add_subparsers(dest="command", required=True)
    compact = commands.add_parser("compact", help="a document longer than the target's window")
    compact.add_argument("--length", type=int, default=24000, help="prompt tokens (target's)")
    compact.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")],
                         default=[8000], help="target tokens kept")
    compact.add_argument("--tasks", type=lambda s: s.split(","), default=["niah"])
    compact.add_argument("--samples", type=int, default=3, help="per task")
    compact.add_argument("--max-new-tokens", type=int, default=12)
    compact.add_argument("--seed", type=int, default=0)
    compact.add_argument("--target", default="smollm2-135m")
    compact.add_argument("--draft", default="gemma3-270m")
    args = parser.parse_args(argv)
    {"compact": run_compact}[args.command](args)


if __name__ == "__main__":
    main()
