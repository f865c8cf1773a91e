"""Speculative prefill in the eval grid: each sample stands for the request the services would
get (its message through the target's chat template, or a text prompt in the raw format); the
draft ranks it once in its own format, and for every keep share the target prefills the kept
tokens (full cache) and answers.

The rows sit beside the grid's ``full`` rows (policy ``speculative``, budget label the keep
share), so every accuracy table reports them relative to the target's full prompt. A sample
the draft cannot read (longer than its context) is skipped and listed, not answered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tqdm import tqdm

from evaldata import Sample
from evaluation.config import FULL, SPECULATIVE, EvalConfig, SpeculativeGrid
from evaluation.lockstep import RowInput, RowOutput, decode_rows
from evaluation.results import Row
from evaluation.runner import max_new_tokens, model_inputs, prompt_text
from snapstream.chat import ChatMessage
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.specprefill.pieces import Rendering, Request, render_served
from snapstream.specprefill.selector import (
    DraftSelector,
    PromptTooLongForDraft,
    Selection,
    pick,
)

# the eval's prompt format -> the request a sample stands for, as a client would send it
SAMPLE_REQUESTS: dict[str, Callable[[Sample], Request]] = {
    "chat": lambda sample: Request((ChatMessage("user", sample.body),), is_chat=True),
    "raw": lambda sample: Request.completion(prompt_text(sample)),
}


def sample_request(target: Engine, sample: Sample, prompt_format: str
                   ) -> tuple[Request, Rendering]:
    """The request ``sample`` stands for and the target's rendering of it (its prompt text)."""
    request = SAMPLE_REQUESTS[prompt_format](sample)
    view = render_served(target.tokenizer, request)
    if view.text != prompt_text(sample):
        raise ValueError(f"prompt_format {prompt_format!r}: the request a sample stands for does "
                         "not render as its prompt; use the target's own format")
    return request, view


def needle_kept(text: str, sample: Sample, offsets: list[tuple[int, int]],
                kept: list[int]) -> float:
    """Share of the target needles' tokens (``offsets``: the target's tokens of ``text``, which
    holds each needle's text) that ``kept`` (token indices) holds."""
    spans = [(start := text.index(n.text), start + len(n.text))
             for n in sample.needles if n.is_target]
    inside = {i for i, (a, b) in enumerate(offsets) for start, end in spans
              if a < end and b > start}
    return len(inside & set(kept)) / len(inside)


def keep_label(keep: float) -> str:
    return f"keep {keep:g}"


def evaluate_speculative(target: Engine, draft: Engine, cfg: EvalConfig,
                         samples: Sequence[Sample], progress: bool = True
                         ) -> tuple[list[Row], list[dict]]:
    """One row per sample and keep share of ``cfg.speculative``; and the samples the draft
    could not read (index, task, length, why)."""
    grid = cfg.speculative
    if grid is None:
        raise ValueError("evaluate_speculative needs a config with a speculative grid")
    selector, policy = DraftSelector(draft), cfg.split_rule.policy(FULL, 0)
    rows, skipped = [], []
    with tqdm(total=len(samples) * (1 + len(grid.keeps)), desc="speculative", unit="run",
              disable=not progress, smoothing=0.0) as bar:
        for index, sample in enumerate(samples):
            request, view = sample_request(target, sample, cfg.prompt_format)
            _, forced = model_inputs(target, cfg, 0, index, sample)
            try:
                ranking = selector.rank(request, grid.settings(grid.keeps[0]))
            except PromptTooLongForDraft as exc:
                skipped.append({"sample": index, "task": sample.task,
                                "context_len": sample.context_len, "why": str(exc)})
                tqdm.write(f"speculative: sample {index} ({sample.task}, {sample.context_len}) "
                           f"skipped: {exc}")
                bar.update(1 + len(grid.keeps))
                continue
            bar.update(1)
            _, offsets = target.tokenizer.encode_with_offsets(view.text)
            for keep in grid.keeps:
                selection = pick(ranking, view, target.tokenizer, grid.settings(keep),
                                 view.text.rindex(sample.question))
                new = max_new_tokens(target, sample)
                prefilled = target.prefill(selection.ids, policy, len(forced) + new,
                                           positions=selection.positions)
                out, = decode_rows(target, [RowInput(
                    cache=prefilled.cache, logits=prefilled.logits, forced_ids=tuple(forced),
                    answers=sample.answers, max_new_tokens=new, scoring=sample.scoring)])
                rows.append(_row(index, sample, grid, keep, policy, selection, len(forced),
                                 out, needle_kept(view.text, sample, offsets, selection.indices)))
                bar.update(1)
    return rows, skipped


def _row(index: int, sample: Sample, grid: SpeculativeGrid, keep: float, policy: CachePolicy,
         selection: Selection, num_forced: int, out: RowOutput, needle: float) -> Row:
    return Row(
        sample=index, task=sample.task, context_len=sample.context_len, depth=sample.depth,
        placement=str(sample.placement), gap=0, policy=SPECULATIVE,
        budget_label=keep_label(keep), budget=len(selection.ids),
        budget_fraction=selection.kept_share, n_sink=policy.n_sink, n_topk=policy.n_topk,
        n_recent=policy.n_recent, observation=policy.observation, kernel=policy.kernel,
        pooling=policy.pooling, observe=policy.observe, unit=policy.unit,
        correct=bool(out.correct),
        answer=sample.answer,
        generated=out.text, prompt_tokens=selection.num_prompt_tokens,
        new_tokens=len(out.token_ids), finish_reason=out.finish_reason,
        forced_nll=out.mean_forced_nll(num_forced), draft=grid.draft, keep=keep,
        needle_kept=needle)
