"""Same weights, same prompt ids: snapstream's cache policies next to NVIDIA kvpress's presses.

``python -m evaluation.press_compare --out DIR``

kvpress runs in the bench-only ``kvpress`` venv (``bench.peers``: kvpress 0.5.5 on
transformers < 5.3, built on first use and cached) through the peers' transformers runner
(``runners/run_hf.py``): the GGUF dequantized to float32 by transformers, greedy decoding with
explicit positions. snapstream decodes the same ids in this process meanwhile (the runner is
driven from a thread), so the two share the machine's two cores.

Every system writes ``max_new_tokens`` greedy tokens per prompt (cut at the first end-of-turn
token). Parity: the share of prompts whose tokens are identical between a kvpress press and
the snapstream policy set up to match it (``PAIRS``). Accuracy: the same exact-match verdict as
``snapstream eval`` on each system's text.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from evaldata import Sample
from evaluation.budget import Budget, SplitRule
from snapstream.policy import CachePolicy

N_SINK = 4
# (kvpress system, snapstream system) pairs whose greedy tokens should agree
PAIRS = (("kvpress full", "full"), ("kvpress SnapKVPress", "snapkv (kvpress layout)"),
         ("kvpress StreamingLLMPress", "streaming"))


@dataclass(frozen=True)
class Settings:
    observation: int
    kernel: int
    budgets: tuple[Budget, ...]
    other_press_budgets: tuple[str, ...]  # budgets at which StreamingLLM/ExpectedAttention run
    with_full: bool  # also run kvpress without a press (transformers' full cache)


def our_policies(s: Settings, tokens: int | None) -> dict[str, CachePolicy]:
    """snapstream's systems at ``tokens`` (None: the full cache only)."""
    if tokens is None:
        return {"full": CachePolicy(kind="full")}
    return {
        # kvpress's SnapKV: no sinks, the observation window kept as the recent part
        "snapkv (kvpress layout)": CachePolicy(
            kind="snapkv", n_sink=0, n_topk=tokens - s.observation, n_recent=s.observation,
            observation=s.observation, kernel=s.kernel, pooling="avg"),
        "streaming": CachePolicy(kind="streaming", n_sink=N_SINK, n_topk=0,
                                 n_recent=tokens - N_SINK, observation=s.observation),
        # snapstream with the presses' observation window and kernel: 4 sinks, a quarter of the
        # budget ring
        "snapstream (same observation, kernel)": SplitRule(
            n_sink=N_SINK, observation=s.observation, recent_fraction=0.25, kernel=s.kernel,
            pooling="avg").policy("snapstream", tokens),
    }


def kvpress_presses(s: Settings, num_tokens: int, label: str | None, tokens: int | None
                    ) -> dict[str, dict | None]:
    """kvpress's systems for a prompt of ``num_tokens`` kept to ``tokens`` (budget ``label``):
    SnapKV at every budget, the other presses at ``other_press_budgets`` (each costs a
    transformers prefill on a loaded 2-core machine)."""
    from bench.peers.systems import compression_ratio

    if tokens is None:
        return {"kvpress full": None} if s.with_full else {}
    ratio = compression_ratio(num_tokens, tokens)
    presses = {"kvpress SnapKVPress": {"name": "SnapKVPress", "kwargs": {
        "compression_ratio": ratio, "window_size": s.observation, "kernel_size": s.kernel}}}
    if label in s.other_press_budgets:
        presses |= {
            "kvpress StreamingLLMPress": {"name": "StreamingLLMPress", "kwargs": {
                "compression_ratio": ratio, "n_sink": N_SINK}},
            "kvpress ExpectedAttentionPress": {"name": "ExpectedAttentionPress", "kwargs": {
                "compression_ratio": ratio}},
        }
    return presses


def _budget_points(s: Settings, sample: Sample) -> list[tuple[str | None, int | None]]:
    return [(None, None), *((b.label, b.tokens_for(sample.context_len)) for b in s.budgets)]


def run_ours(engine, s: Settings, samples: list[Sample], ids: list[list[int]],
             max_new: list[int]) -> list[dict]:
    from evaluation.forward import PromptForward
    from evaluation.lockstep import RowInput, decode_rows

    records = []
    for index, sample in enumerate(samples):
        forward = PromptForward.run(engine.model, ids[index], s.observation)
        for label, tokens in _budget_points(s, sample):
            for name, policy in our_policies(s, tokens).items():
                cache = forward.sequence_cache(policy, max_new[index])
                out = decode_rows(engine, [RowInput(cache, forward.logits, (), (),
                                                    max_new[index])])[0]
                records.append(_record(index, sample, name, label, out.token_ids, out.text))
        print(f"snapstream: {index + 1}/{len(samples)} prompts", file=sys.stderr, flush=True)
    return records


def run_kvpress(s: Settings, samples: list[Sample], ids: list[list[int]], max_new: list[int],
                tokenizer, log_dir: Path) -> tuple[list[dict], dict]:
    from bench.peers import recipes
    from bench.peers.models import RUNNERS, hf_model_dir
    from bench.peers.process import RunnerError, RunnerProcess
    from bench.peers.venvs import ensure_venv
    from snapstream.checkpoints.registry import model_path

    def echo(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    venv = ensure_venv(recipes.KVPRESS, echo)
    records, failures = [], {}
    eos = set(tokenizer.eos_token_ids)
    with RunnerProcess(venv.python, RUNNERS / "run_hf.py", log_dir / "kvpress_runner.log") as r:
        # run_hf loads the Hugging Face directory exported once from the GGUF (bench.peers)
        r.call("load", model=str(hf_model_dir(venv, model_path(), echo)), n_threads=1,
               n_ctx=8192)
        start = time.perf_counter()
        for index, sample in enumerate(samples):
            for label, tokens in _budget_points(s, sample):
                for name, press in kvpress_presses(s, len(ids[index]), label, tokens).items():
                    if name in failures:
                        continue
                    options = {"press": press} if press else {}
                    try:
                        reply = r.call("generate", prompt_ids=ids[index],
                                       max_new_tokens=max_new[index], options=options)
                    except RunnerError as exc:
                        failures[name] = str(exc)
                        echo(f"kvpress: {name} failed, skipped from now on: {exc}")
                        continue
                    token_ids = _until_eos(reply["token_ids"], eos)
                    records.append(_record(index, sample, name, label, token_ids,
                                           tokenizer.decode(token_ids)))
            elapsed = time.perf_counter() - start
            echo(f"kvpress: {index + 1}/{len(samples)} prompts, {elapsed / 60:.1f} min, ETA "
                 f"{elapsed / (index + 1) * (len(samples) - index - 1) / 60:.1f} min")
        versions = r.hello["versions"]
    return records, {"versions": versions, "failures": failures}


def _until_eos(token_ids: list[int], eos: set[int]) -> list[int]:
    cut = next((i for i, t in enumerate(token_ids) if t in eos), len(token_ids))
    return token_ids[:cut]


def _record(index: int, sample: Sample, system: str, budget: str | None, token_ids: list[int],
            text: str) -> dict:
    return {"sample": index, "task": sample.task, "context_len": sample.context_len,
            "system": system, "budget": budget, "token_ids": token_ids, "text": text,
            "correct": sample.is_correct(text)}


def main(argv: list[str] | None = None) -> int:
    from evaluation.config import EvalConfig
    from evaluation.press_report import accuracy, parity, render
    from evaluation.runner import max_new_tokens
    from snapstream.engine import Engine

    args = _parser().parse_args(argv)
    engine = Engine.from_pretrained(None, dtype="float32")  # kvpress runs the fp32 weights
    settings = Settings(observation=args.observation, kernel=args.kernel,
                        budgets=tuple(Budget.parse(b) for b in args.budgets.split(",")),
                        other_press_budgets=tuple(args.other_press_budgets.split(",")),
                        with_full=args.kvpress_full)
    cfg = EvalConfig(tasks=tuple(args.tasks.split(",")),
                     context_lens=tuple(int(n) for n in args.context_lens.split(",")),
                     placements=("after",), n_per_cell=args.n_per_cell, seed=args.seed)
    samples = cfg.samples(engine.tokenizer)
    ids = [engine.encode(sample.prompt) for sample in samples]
    max_new = [max_new_tokens(engine, sample) for sample in samples]
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=1) as pool:
        theirs = pool.submit(run_kvpress, settings, samples, ids, max_new, engine.tokenizer,
                             args.out)
        records = run_ours(engine, settings, samples, ids, max_new)
        their_records, info = theirs.result()
    records += their_records
    result = {"config": {**cfg.to_json(), "observation": args.observation, "kernel": args.kernel,
                         "budgets": args.budgets, "n_sink": N_SINK,
                         "other_press_budgets": args.other_press_budgets,
                         "kvpress_full": args.kvpress_full}, "kvpress": info,
              "parity": parity(records, PAIRS), "accuracy": accuracy(records),
              "records": records}
    (args.out / "press_compare.json").write_text(json.dumps(result, indent=1) + "\n")
    print(render(result["parity"], result["accuracy"]))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m evaluation.press_compare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="niah,multikey,kv,vartrack,realtext")
    parser.add_argument("--context-lens", default="1024,2048")
    parser.add_argument("--n-per-cell", type=int, default=2)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--observation", type=int, default=32)
    parser.add_argument("--kernel", type=int, default=7)
    parser.add_argument("--budgets", default="1/4,1/8")
    parser.add_argument("--other-press-budgets", default="1/4",
                        help="budgets at which kvpress's StreamingLLM and ExpectedAttention run")
    parser.add_argument("--kvpress-full", action="store_true",
                        help="also run kvpress without a press")
    parser.add_argument("--out", type=Path, required=True)
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
