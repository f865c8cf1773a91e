"""Greedy decoding of several prompts at once under one cache layout, scored as it goes.

Each row first decodes its forced tokens (text written as if the model had generated it, then
the answer cue), scoring how well the model predicts them (their mean negative log-likelihood:
how well it still models text it writes once the cache has evicted most of it), then generates
greedily until the row's scorer (:data:`~evaldata.SCORERS`) decides, a stop token comes, or
``max_new_tokens`` are written (a row with no answers is not scored: it runs to a stop token or
the limit). All rows step together through one static decode step, as in serving; a finished
row idles until the batch ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from evaldata import score
from snapstream.engine import Engine
from snapstream.kvcache import SequenceCache


@dataclass(frozen=True)
class RowInput:
    cache: SequenceCache
    logits: torch.Tensor  # (V,) after the last prompt token
    forced_ids: tuple[int, ...]
    answers: tuple[str, ...]
    max_new_tokens: int
    scoring: str = "values"  # the scorer of the answers (evaldata.SCORERS)


@dataclass
class RowOutput:
    token_ids: list[int]
    text: str = ""
    correct: bool | None = None  # None while undecided
    finish_reason: str = ""  # "verdict" | "stop_token" | "length"
    forced_nll: float = 0.0  # summed negative log-likelihood of the forced tokens, nats

    def mean_forced_nll(self, num_forced: int) -> float | None:
        return self.forced_nll / num_forced if num_forced else None


@torch.no_grad()
def decode_rows(engine: Engine, rows: Sequence[RowInput]) -> list[RowOutput]:
    """Every row's greedy continuation and verdict; the rows' caches share one layout."""
    decoder = engine.new_decoder(rows[0].cache.layout, batch_size=len(rows))
    for index, row in enumerate(rows):
        decoder.cache.insert(index, row.cache)
    positions = torch.tensor([row.cache.next_position for row in rows], device=engine.device)
    logits = torch.stack([row.logits for row in rows])  # (B, V)
    outputs = [RowOutput(token_ids=[]) for _ in rows]
    stop_ids = set(engine.tokenizer.eos_token_ids)
    for step in range(max(len(r.forced_ids) + r.max_new_tokens for r in rows)):
        greedy = logits.argmax(dim=-1).tolist()  # (B,)
        _score_forced(rows, outputs, step, logits)
        tokens = [_next_token(engine, row, out, step, greedy[i], stop_ids)
                  for i, (row, out) in enumerate(zip(rows, outputs, strict=True))]
        if all(out.finish_reason for out in outputs):
            break
        logits = decoder.step(torch.tensor(tokens, device=engine.device), positions)
        positions += 1
    return outputs


def _score_forced(rows: Sequence[RowInput], outputs: list[RowOutput], step: int,
                  logits: torch.Tensor) -> None:
    """Add each row's forced token at ``step`` to its ``forced_nll``; logits (B, V)."""
    forcing = [i for i, row in enumerate(rows) if step < len(row.forced_ids)]
    if not forcing:
        return
    log_probs = torch.log_softmax(logits[forcing].float(), dim=-1)  # (F, V)
    targets = torch.tensor([rows[i].forced_ids[step] for i in forcing], device=logits.device)
    nll = -log_probs.gather(1, targets[:, None])[:, 0]  # (F,)
    for i, value in zip(forcing, nll.tolist(), strict=True):
        outputs[i].forced_nll += value


def _next_token(engine: Engine, row: RowInput, out: RowOutput, step: int, greedy: int,
                stop_ids: set[int]) -> int:
    """The token row ``row`` feeds at ``step``; records and scores it once generation began."""
    if step < len(row.forced_ids):
        return row.forced_ids[step]
    if out.finish_reason:
        return greedy  # idle: the row's result is final
    if greedy in stop_ids:
        out.finish_reason = "stop_token"
    else:
        out.token_ids.append(greedy)
    out.text = engine.tokenizer.decode(out.token_ids)
    is_final = bool(out.finish_reason) or len(out.token_ids) == row.max_new_tokens
    if row.answers:
        out.correct = score(row.scoring, row.answers, out.text, is_final)
    if not out.finish_reason and (is_final or out.correct is not None):
        out.finish_reason = "length" if is_final else "verdict"
    return greedy
