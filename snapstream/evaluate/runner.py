"""Decode every sample under every (policy, budget) run and score it by exact match."""

from __future__ import annotations

import random
import time

from tqdm import tqdm

from snapstream.data import ANSWER_CUE, TERMINATOR, Sample, exact_match, filler_corpus
from snapstream.evaluate.config import EvalConfig, Run
from snapstream.evaluate.results import Row
from snapstream.evaluate.shared_prefill import SharedPrefillEngine
from snapstream.policy import CachePolicy
from snapstream.sampling import SamplingParams


def stop_sampling(engine: SharedPrefillEngine) -> SamplingParams:
    """Greedy, stopping at the answer's terminator (one byte, one token)."""
    stop_ids = tuple(engine.tokenizer.encode(TERMINATOR)[-1:])
    return SamplingParams(temperature=0.0, stop_token_ids=stop_ids)


def evaluate(engine: SharedPrefillEngine, cfg: EvalConfig, samples: list[Sample],
             progress: bool = True) -> list[Row]:
    """One :class:`Row` per sample and run, samples outermost (each prompt's forward is shared
    by its runs)."""
    sampling = stop_sampling(engine)
    engine.generate("warm up", max_new_tokens=2, policy=CachePolicy(kind="full"))  # latencies
    total = sum(len(cfg.runs(sample.context_len)) for sample in samples)
    rows = []
    with tqdm(total=total, desc="eval", unit="run", disable=not progress) as bar:
        for index, sample in enumerate(samples):
            ids, forced = model_inputs(engine, cfg, index, sample)
            for run in cfg.runs(sample.context_len):
                rows.append(_run_one(engine, cfg, sampling, (ids, forced), index, sample, run))
                bar.update()
    return rows


def model_inputs(engine: SharedPrefillEngine, cfg: EvalConfig, index: int,
                 sample: Sample) -> tuple[list[int], list[int]]:
    """The prompt's token ids and the ids decoded after it before the answer: none, or with
    ``cfg.gap_tokens``, the prompt stops after the question, and held-out filler of that many
    bytes (from the split, drawn for this sample) and the answer cue follow it as if generated."""
    if not cfg.gap_tokens:
        return engine.encode(sample.prompt), []
    gap = filler_corpus(cfg.split).window(random.Random(f"gap/{cfg.seed}/{index}"),
                                             cfg.gap_tokens).text
    no_bos = len(engine.tokenizer.encode(""))  # 1 when the tokenizer adds BOS
    return (engine.encode(sample.prompt.removesuffix(ANSWER_CUE)),
            engine.encode(f" {gap}{ANSWER_CUE}")[no_bos:])


def _run_one(engine: SharedPrefillEngine, cfg: EvalConfig, sampling: SamplingParams,
             inputs: tuple[list[int], list[int]], index: int, sample: Sample, run: Run) -> Row:
    ids, forced = inputs
    forward_s = engine.forward(ids, run.policy).seconds
    start = time.perf_counter()
    generation = engine.generate(ids, max_new_tokens=cfg.max_new_tokens, policy=run.policy,
                                 sampling=sampling, forced_ids=forced)
    latency_s = forward_s + time.perf_counter() - start
    fraction = None if run.budget_tokens is None else run.budget_tokens / sample.context_len
    return Row(
        sample=index, task=sample.task, context_len=sample.context_len, depth=sample.depth,
        placement=str(sample.placement), policy=run.policy.kind,
        budget_label=run.budget.label if run.budget else None, budget=run.budget_tokens,
        budget_fraction=fraction, correct=exact_match(generation.text, sample.answer),
        answer=sample.answer, generated=generation.text,
        prompt_tokens=generation.prompt_tokens, finish_reason=generation.finish_reason,
        latency_s=latency_s,
    )
