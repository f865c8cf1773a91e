"""Speculative prefill's time to first token: draft + target on the kept tokens against the
target's full prefill, measured per prompt length, and projected on SN40L for a large target
with a small draft (hwsim's cost model).

Each length takes its turns in one process (target alone, draft, target on the kept tokens),
so load from other processes falls on all three alike; compare ratios within a run.
Run: ``snapstream bench specprefill``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench.report import command_line, machine_line, markdown_table, parse_ints, publish
from evaldata import PromptSpec, TaskConfig, generate
from hwsim.policy import PolicyConfig, PolicyKind
from hwsim.sim import SimTarget
from hwsim.speculative import speculative_ttft
from snapstream.checkpoints.registry import draft_name
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.specprefill.pieces import Request, render_served
from snapstream.specprefill.selector import DraftSelector
from snapstream.specprefill.settings import SpeculativeSettings

WARM_UP_TOKENS = 512


def _parse_floats(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.split(",") if part.strip())


@dataclass(frozen=True)
class SpecPrefillBenchConfig:
    target: str = "smollm2-135m"
    draft: str = "gemma3-270m"
    lengths: tuple[int, ...] = (2048, 4096)
    keep: float = 0.25
    rounds: int = 1
    sim_target: str = "llama-3.1-70b"
    sim_draft: str = "llama-3.2-1b"
    sim_sockets: int = 16
    sim_lengths: tuple[int, ...] = (8192, 32768)
    sim_keeps: tuple[float, ...] = (0.1, 0.25, 0.5)

    def __post_init__(self) -> None:
        if not 0.0 < self.keep <= 1.0 or not all(0.0 < k <= 1.0 for k in self.sim_keeps):
            raise ValueError(f"keep shares must be in (0, 1], got {self.keep} and "
                             f"{self.sim_keeps}")
        if not self.lengths or min(self.lengths) < 1 or not self.sim_lengths:
            raise ValueError(f"lengths must be token counts >= 1, got {self.lengths}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")


def measure(cfg: SpecPrefillBenchConfig) -> list[dict]:
    """Per length (passkey prompts, raw, target tokens): median seconds of the target's full
    prefill, the draft's ranking and the target's prefill of the kept tokens, after one
    untimed pass of all three on a short prompt."""
    target, draft = Engine.from_pretrained(cfg.target), Engine.from_pretrained(cfg.draft)
    selector, full = DraftSelector(draft), CachePolicy(kind="full")
    settings = replace(SpeculativeSettings.defaults_for(target.config), keep=cfg.keep)

    def prefill_s(ids: list[int], positions: list[int] | None) -> float:
        start = time.perf_counter()
        target.prefill(ids, full, 1, positions=positions)
        return time.perf_counter() - start

    def sample_ids(length: int) -> tuple[str, list[int]]:
        prompt = generate("passkey", random.Random(f"speculative-ttft/{length}"),
                          TaskConfig(context_len=length), PromptSpec(target.tokenizer, "raw")
                          ).prompt
        return prompt, target.encode(prompt)

    def select(prompt: str):  # a text prompt, as the draft reads it in its own format
        request = Request.completion(prompt)
        return selector.select(request, render_served(target.tokenizer, request),
                               target.tokenizer, settings)

    prompt, ids = sample_ids(WARM_UP_TOKENS)  # untimed: first calls build caches
    prefill_s(ids, None)
    select(prompt)
    rows = []
    for length in cfg.lengths:
        prompt, ids = sample_ids(length)
        times: dict[str, list[float]] = {"full": [], "draft": [], "kept": []}
        for _ in range(cfg.rounds):
            times["full"].append(prefill_s(ids, None))
            selection = select(prompt)
            times["draft"].append(selection.draft_s)
            times["kept"].append(prefill_s(selection.ids, selection.positions))
        rows.append({"prompt_tokens": len(ids), "kept_tokens": len(selection.ids),
                     **{f"{name}_s": statistics.median(v) for name, v in times.items()}})
    return rows


def project(cfg: SpecPrefillBenchConfig) -> list[dict]:
    full = PolicyConfig(PolicyKind.FULL)
    target, draft = (SimTarget.load(name, sockets=cfg.sim_sockets, policy=full)
                     for name in (cfg.sim_target, cfg.sim_draft))
    return [asdict(speculative_ttft(target, draft, length, keep))
            for length in cfg.sim_lengths for keep in cfg.sim_keeps]


def render(cfg: SpecPrefillBenchConfig, measured: list[dict], projected: list[dict],
           command: str, figure: str | None = None) -> str:
    """The section; ``figure``: the TTFT plot's path relative to the page, linked below the
    measured table."""
    table = []
    for r in measured:
        both = r["draft_s"] + r["kept_s"]
        table.append([r["prompt_tokens"], r["kept_tokens"], f"{r['full_s']:.2f}",
                      f"{r['draft_s']:.2f}", f"{r['kept_s']:.2f}", f"{both:.2f}",
                      f"{both / r['full_s']:.2f}×", f"{1 - r['kept_s'] / r['full_s']:.0%}"])
    sim = []
    for r in projected:
        draft = r["draft_prefill_s"] + r["draft_look_ahead_s"]
        both = draft + r["target_kept_s"]
        sim.append([r["prompt_len"], f"{r['keep']:.0%}", f"{r['target_full_s'] * 1e3:.0f}",
                    f"{draft * 1e3:.1f}", f"{r['target_kept_s'] * 1e3:.0f}",
                    f"{both * 1e3:.0f}", f"{both / r['target_full_s']:.2f}×"])
    return "\n\n".join([
        f"## Speculative prefill: time to first token, {Path(cfg.draft).name} drafting for "
        f"{Path(cfg.target).name}",
        f"Command: `{command}`  \nMachine: {machine_line()}: compare ratios within a row "
        "only (other jobs' load falls on all three timings alike).",
        f"Measured: {cfg.draft} drafting for {cfg.target} at keep {cfg.keep:g} (passkey "
        f"prompts, raw; `full` cache policy, so the prefill is the whole cost; median of "
        f"{cfg.rounds} round(s), after an untimed warm-up pass on a {WARM_UP_TOKENS}-token "
        "prompt). Draft s: the draft's prefill, look-ahead and ranking, and "
        "the mapping to the target's tokens.",
        markdown_table(["prompt tokens", "kept tokens", "target alone s", "draft s",
                        "target on kept s", "draft + target s", "/ target alone",
                        "target prefill saved"], table),
        f"Projected (hwsim, SN40L, {cfg.sim_sockets} socket{'s' * (cfg.sim_sockets != 1)}, "
        "bf16, `full` policy): "
        f"{cfg.sim_draft} drafting for {cfg.sim_target}; the draft prefills the whole prompt "
        "and decodes 8 look-ahead tokens on the same sockets before the target prefills the "
        "kept tokens; selection and mapping cost nothing (the two share a tokenizer); "
        "assumptions in docs/speculative.md.",
        markdown_table(["prompt tokens", "keep", "target alone ms", "draft ms",
                        "target on kept ms", "draft + target ms", "/ target alone"], sim),
        *([f"![time to first token against prompt tokens]({figure})"] if figure else []),
    ])


def register(parser: argparse.ArgumentParser) -> None:
    d = SpecPrefillBenchConfig()
    parser.add_argument("--target", default=d.target, help="model name or path")
    parser.add_argument("--draft", default=d.draft,
                        help="model name or path; auto: the target's default draft")
    parser.add_argument("--lengths", type=parse_ints, default=d.lengths)
    parser.add_argument("--keep", type=float, default=d.keep, help="share in (0, 1]")
    parser.add_argument("--rounds", type=int, default=d.rounds)
    parser.add_argument("--sim-target", default=d.sim_target, help="hwsim target")
    parser.add_argument("--sim-draft", default=d.sim_draft, help="hwsim target")
    parser.add_argument("--sim-sockets", type=int, default=d.sim_sockets)
    parser.add_argument("--sim-lengths", type=parse_ints, default=d.sim_lengths)
    parser.add_argument("--sim-keeps", type=_parse_floats, default=d.sim_keeps)
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--no-doc", action="store_true", help="print only")
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None,
                        help="a PNG of time to first token against prompt tokens: the target "
                             "alone, the draft, and draft + target")


def run(args: argparse.Namespace) -> int:
    cfg = SpecPrefillBenchConfig(
        target=args.target, draft=draft_name(args.draft, args.target), lengths=args.lengths,
        keep=args.keep, rounds=args.rounds, sim_target=args.sim_target, sim_draft=args.sim_draft,
        sim_sockets=args.sim_sockets, sim_lengths=args.sim_lengths, sim_keeps=args.sim_keeps)
    projected = project(cfg)
    measured = measure(cfg)
    results = {"measured": measured, "projected": projected}
    section = f"specprefill-{Path(cfg.draft).name}-{Path(cfg.target).name}"
    figure = args.plot and os.path.relpath(args.plot, args.doc.parent)
    publish(render(cfg, measured, projected, command_line(), figure), section,
            None if args.no_doc else args.doc, results, args.json_out)
    if args.plot is not None:
        plot(cfg, measured, args.plot)
    return 0


def plot(cfg: SpecPrefillBenchConfig, measured: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = [r["prompt_tokens"] for r in measured]
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, values in (
            (f"{Path(cfg.target).name} alone (full prefill)", [r["full_s"] for r in measured]),
            (f"{Path(cfg.draft).name} (draft)", [r["draft_s"] for r in measured]),
            (f"draft + target on kept {cfg.keep:.0%}",
             [r["draft_s"] + r["kept_s"] for r in measured])):
        ax.plot(tokens, values, marker="o", label=label)
    ax.set(xlabel="prompt tokens", ylabel="time to first token (s)")
    ax.set_title(f"{Path(cfg.draft).name} drafting for {Path(cfg.target).name}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
