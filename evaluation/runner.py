"""Evaluate samples under every run: one forward per prompt shared by all its runs, and each
run decoded for a group of prompts at once (:mod:`~evaluation.lockstep`).

Runs whose policies are equal (``1/4`` of 1024 tokens and ``256``) are decoded once and
reported under each label. Every prompt stops before its answer cue, which is decoded as
forced tokens (:func:`model_inputs`), so one forward serves every gap. Progress counts the
token positions run: each distinct prompt's forward, then each policy's decode of a group
(forced tokens and the most new tokens a row may take), so long forced decodes weigh in its
ETA. Every row carries what its cache and observation window make of the target needles
(:mod:`~evaluation.needles`), to tell why a target is missed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from tqdm import tqdm

from evaldata import Sample, corpus
from evaluation.config import EvalConfig, Run
from evaluation.forward import PromptForward
from evaluation.lockstep import RowInput, RowOutput, decode_rows
from evaluation.needles import NeedleTokens, attention_share, held_share, needle_tokens
from evaluation.results import Row
from snapstream.engine import Engine
from snapstream.kvcache import SequenceCache
from snapstream.policy import CachePolicy
from snapstream.probe import probe_ids
from snapstream.units import unit_spans

ANSWER_SLACK_TOKENS = 6  # room for a space, separators and a closing word after the values
GAP_CHARS_PER_TOKEN = 8  # filler characters drawn per gap token (more than enough)


def evaluate(engine: Engine, cfg: EvalConfig, samples: Sequence[Sample], progress: bool = True,
             runs_for: Callable[[int], list[Run]] | None = None,
             forwards: dict[tuple[int, ...], PromptForward] | None = None,
             max_observation: int = 0, indices: Sequence[int] | None = None) -> list[Row]:
    """One :class:`Row` per sample, gap and run (``runs_for(context_len)``, by default
    ``cfg.runs``). ``forwards``: a cache the caller keeps, so that a later call on the same
    samples runs no prompt again (it must ask for no observation window above the first call's,
    which
    keeps the last ``max_observation`` queries at least). ``indices``: each sample's index in the
    grid (by default its place in ``samples``), which its rows carry and its gap prose is
    drawn by."""
    runs_for = runs_for or cfg.runs
    indexed = list(zip(range(len(samples)) if indices is None else indices, samples, strict=True))
    groups = [(group, runs_for(group[0][1].context_len))
              for group in _groups(indexed, cfg.max_group_tokens)]
    inputs = {(gap, index): model_inputs(engine, cfg, gap, index, sample)
              for group, _ in groups for index, sample in group for gap in cfg.gaps}
    rows: list[Row] = []
    total = _work(engine, cfg.gaps, groups, inputs, cached=forwards or {})
    with tqdm(total=total, desc="eval", unit="tok",
              unit_scale=True, disable=not progress, smoothing=0.0) as bar:
        for group, runs in groups:
            # every gap has the same prompt; a caller's cache keeps every prompt
            shared = {} if forwards is None else forwards
            observation = max(max_observation, *(run.policy.observation for run in runs))
            for gap in cfg.gaps:
                rows += _evaluate_group(engine, gap, group, [inputs[gap, i] for i, _ in group],
                                        runs, observation, shared, on_progress=bar.update)
    return rows


def _work(engine: Engine, gaps: tuple[int, ...],
          groups: list[tuple[list[tuple[int, Sample]], list[Run]]],
          inputs: dict[tuple[int, int], tuple[list[int], list[int]]],
          cached: dict[tuple[int, ...], PromptForward]) -> int:
    """Token positions :func:`evaluate` runs: every distinct prompt's forward not ``cached``,
    and per group, gap and distinct policy, each row's forced tokens and new-token budget."""
    prompts = {tuple(ids) for ids, _ in inputs.values()} - cached.keys()
    decoded = sum(len(dict.fromkeys(run.policy for run in runs))
                  * (len(inputs[gap, index][1]) + max_new_tokens(engine, sample))
                  for group, runs in groups for index, sample in group for gap in gaps)
    return sum(map(len, prompts)) + decoded


def _groups(samples: list[tuple[int, Sample]], max_tokens: int
            ) -> Iterator[list[tuple[int, Sample]]]:
    """Indexed samples of one context length, at most ``max_tokens`` prompt tokens a group."""
    ordered = sorted(samples, key=lambda pair: pair[1].context_len)
    group: list[tuple[int, Sample]] = []
    for index, sample in ordered:
        is_full = sum(s.num_tokens for _, s in group) + sample.num_tokens > max_tokens
        if group and (is_full or sample.context_len != group[0][1].context_len):
            yield group
            group = []
        group.append((index, sample))
    if group:
        yield group


def _evaluate_group(engine: Engine, gap: int, group: list[tuple[int, Sample]],
                    inputs: list[tuple[list[int], list[int]]], runs: list[Run],
                    max_observation: int, shared: dict[tuple[int, ...], PromptForward], *,
                    on_progress: Callable[[int], object]) -> list[Row]:
    """``inputs``: each row's :func:`model_inputs`; ``shared``: forwards kept for the next gap
    (and, when the caller passed its cache, for the caller)."""
    forwards = []
    for ids, _ in inputs:
        forward = shared.get(tuple(ids))
        if forward is None:  # with the probe a run observes, if one does (the longest one)
            probe = max((probe_ids(engine.tokenizer, ids, run.policy.observe) for run in runs),
                        key=len)
            spans = {run.policy.unit: unit_spans(engine.tokenizer, ids, run.policy.unit)
                     for run in runs}
            forward = PromptForward.run(engine.model, ids, max_observation, probe, spans)
            on_progress(len(ids))
        shared[tuple(ids)] = forward
        forwards.append(forward)
    budgets = [max_new_tokens(engine, sample) for _, sample in group]
    extra = max(len(forced) + new for (_, forced), new in zip(inputs, budgets, strict=True))
    longest = max(forward.prompt_len for forward in forwards)
    tokens = [needle_tokens(engine.tokenizer.encode_with_offsets(prompt_text(sample))[1], sample)
              for _, sample in group]
    outputs: dict[CachePolicy, list[RowOutput]] = {}
    analyses: dict[CachePolicy, list[Analysis]] = {}
    for policy in dict.fromkeys(run.policy for run in runs):
        # growing layouts sized alike for every row, with room for the policy's own budget
        capacity = max(longest, policy.budget) + extra
        caches = [forward.sequence_cache(policy, len(forced) + new, capacity)
                  for forward, (_, forced), new in zip(forwards, inputs, budgets, strict=True)]
        analyses[policy] = [_analysis(forward, cache, policy, where)
                            for forward, cache, where in zip(forwards, caches, tokens, strict=True)]
        outputs[policy] = decode_rows(engine, [
            RowInput(cache=cache, logits=forward.logits, forced_ids=tuple(forced),
                     answers=sample.answers, max_new_tokens=new, scoring=sample.scoring)
            for forward, cache, (_, forced), new, (_, sample)
            in zip(forwards, caches, inputs, budgets, group, strict=True)])
        on_progress(sum(len(forced) + new for (_, forced), new in zip(inputs, budgets,
                                                                       strict=True)))
    return [_row(index, sample, gap, run, forward.prompt_len, len(forced), out, analysis)
            for run in runs
            for (index, sample), forward, (_, forced), out, analysis
            in zip(group, forwards, inputs, outputs[run.policy], analyses[run.policy],
                   strict=True)]


@dataclass(frozen=True)
class Analysis:
    """What a row's cache and observation window make of its needles (evaluation.needles)."""

    needle_kept: float | None
    answer_kept: float | None
    needle_attention: float | None


def _analysis(forward: PromptForward, cache: SequenceCache, policy: CachePolicy,
              where: NeedleTokens) -> Analysis:
    votes = forward.scores(policy.observation, 1, "avg", policy.observe)  # (L, Hkv, P), unpooled
    return Analysis(needle_kept=held_share(cache, where.needle),
                    answer_kept=held_share(cache, where.answer),
                    needle_attention=attention_share(votes, forward.windows, where.needle))


def max_new_tokens(engine: Engine, sample: Sample) -> int:
    return len(engine.tokenizer.encode(" " + sample.answer)) + ANSWER_SLACK_TOKENS


def model_inputs(engine: Engine, cfg: EvalConfig, gap: int, index: int,
                 sample: Sample) -> tuple[list[int], list[int]]:
    """The prompt's token ids and the ids decoded after it before generation. The prompt stops
    before the answer cue, as a served request stops at the assistant's turn: the cue is the
    start of the answer, not something compression may look at. With a ``gap``, ``gap`` tokens
    of prose (drawn for this sample) come first, as if generated, then the cue."""
    head = sample.prompt.removesuffix(sample.cue)
    prompt = prompt_text(sample)
    no_bos = len(engine.tokenizer.encode(""))  # 1 when the tokenizer adds BOS
    if not gap:
        return engine.encode(prompt), engine.tokenizer.encode(head[len(prompt):] + sample.cue)[
            no_bos:]
    rng = random.Random(f"gap/{cfg.seed}/{index}")
    prose = corpus("prose")
    text = prose.window(prose.draw_start(rng), gap * GAP_CHARS_PER_TOKEN).text
    gap_ids = engine.tokenizer.encode(text)[no_bos:][:gap]
    cue_ids = engine.tokenizer.encode(f"\n\n{sample.cue}")[no_bos:]
    return engine.encode(prompt), gap_ids + cue_ids


def prompt_text(sample: Sample) -> str:
    """The sample's prompt up to its answer cue: what the model reads before it answers."""
    # raw's "Answer: ": the space starts the cue's first token
    return sample.prompt.removesuffix(sample.cue).rstrip(" ")


def _row(index: int, sample: Sample, gap: int, run: Run, prompt_len: int, num_forced: int,
         out: RowOutput, analysis: Analysis) -> Row:
    policy = run.policy
    fraction = None if run.budget_tokens is None else run.budget_tokens / sample.context_len
    return Row(
        sample=index, task=sample.task, context_len=sample.context_len, depth=sample.depth,
        placement=str(sample.placement), gap=gap, policy=policy.kind,
        budget_label=run.budget.label if run.budget else None, budget=run.budget_tokens,
        budget_fraction=fraction, n_sink=policy.n_sink, n_topk=policy.n_topk,
        n_recent=policy.n_recent, observation=policy.observation, kernel=policy.kernel,
        pooling=policy.pooling, observe=policy.observe, unit=policy.unit,
        correct=bool(out.correct),
        answer=sample.answer,
        generated=out.text, prompt_tokens=prompt_len, new_tokens=len(out.token_ids),
        finish_reason=out.finish_reason, forced_nll=out.mean_forced_nll(num_forced),
        needle_kept=analysis.needle_kept, answer_kept=analysis.answer_kept,
        needle_attention=analysis.needle_attention)
