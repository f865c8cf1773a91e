"""Speculative prefill in the eval grid: the draft ranks each sample's prompt once, and for
every keep share the target prefills the kept tokens (full cache) and answers.

The rows sit beside the grid's ``full`` rows (policy ``speculative``, budget label the keep
share), so every accuracy table reports them relative to the target's full prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from tqdm import tqdm

from evaldata import Sample
from evaluation.config import FULL, SPECULATIVE, EvalConfig, SpeculativeGrid
from evaluation.lockstep import RowInput, RowOutput, decode_rows
from evaluation.results import Row
from evaluation.runner import max_new_tokens, model_inputs, prompt_text
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.specprefill.selector import DraftSelector, Selection, pick


def keep_label(keep: float) -> str:
    return f"keep {keep:g}"


def evaluate_speculative(target: Engine, draft: Engine, cfg: EvalConfig,
                         samples: Sequence[Sample], progress: bool = True) -> list[Row]:
    """One row per sample and keep share of ``cfg.speculative``."""
    grid = cfg.speculative
    if grid is None:
        raise ValueError("evaluate_speculative needs a config with a speculative grid")
    selector, policy = DraftSelector(draft), cfg.split_rule.policy(FULL, 0)
    rows = []
    with tqdm(total=len(samples) * (1 + len(grid.keeps)), desc="speculative", unit="run",
              disable=not progress, smoothing=0.0) as bar:
        for index, sample in enumerate(samples):
            text = prompt_text(sample)
            _, forced = model_inputs(target, cfg, 0, index, sample)
            ranking = selector.rank(text, grid.settings(grid.keeps[0]))
            bar.update(1)
            for keep in grid.keeps:
                selection = pick(ranking, target.tokenizer, grid.settings(keep),
                                 text.rindex(sample.question))
                new = max_new_tokens(target, sample)
                prefilled = target.prefill(selection.ids, policy, len(forced) + new,
                                           positions=selection.positions)
                out, = decode_rows(target, [RowInput(
                    cache=prefilled.cache, logits=prefilled.logits, forced_ids=tuple(forced),
                    answers=sample.answers, max_new_tokens=new)])
                rows.append(_row(index, sample, grid, keep, policy, selection, len(forced),
                                 out))
                bar.update(1)
    return rows


def _row(index: int, sample: Sample, grid: SpeculativeGrid, keep: float, policy: CachePolicy,
         selection: Selection, num_forced: int, out: RowOutput) -> Row:
    return Row(
        sample=index, task=sample.task, context_len=sample.context_len, depth=sample.depth,
        placement=str(sample.placement), gap=0, policy=SPECULATIVE,
        budget_label=keep_label(keep), budget=len(selection.ids),
        budget_fraction=selection.kept_share, n_sink=policy.n_sink, n_topk=policy.n_topk,
        n_recent=policy.n_recent, window=policy.window, kernel=policy.kernel,
        pooling=policy.pooling, correct=bool(out.correct), answer=sample.answer,
        generated=out.text, prompt_tokens=selection.num_prompt_tokens,
        new_tokens=len(out.token_ids), finish_reason=out.finish_reason,
        forced_nll=out.mean_forced_nll(num_forced), draft=grid.draft, keep=keep)
