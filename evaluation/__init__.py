"""`snapstream eval`: retrieval accuracy of cache policies across budgets, on RULER-style tasks
and on workloads on real text.

- :mod:`~evaluation.budget`: budgets (fraction of the context or token count) and the
  rule that splits one into ``n_sink | n_topk | n_recent``;
- :mod:`~evaluation.config`: :class:`EvalConfig`, the sample grid and its runs;
- :mod:`~evaluation.forward`: a prompt's forward, run once and compressed into any
  policy's layout (SnapKV scores computed per (observation, kernel, pooling) when first asked);
- :mod:`~evaluation.lockstep`: greedy decoding of a group of prompts under one
  layout, scored as it goes;
- :mod:`~evaluation.runner`, :mod:`~evaluation.results`,
  :mod:`~evaluation.plots`: the grid, CSV/JSON, figures;
- :mod:`~evaluation.cells`: the grid in resumable cells (task x length x placement);
- :mod:`~evaluation.needles`: what a cache and the observation window make of a sample's
  needles (why a target is missed); :mod:`~evaluation.targets`: the accuracy targets;
- :mod:`~evaluation.peer_rows`: peer systems (kvpress, OpenVINO GenAI) answering the grid;
- :mod:`~evaluation.sweep`: the cache-policy sweep that picks a model's default.

This package imports no torch or matplotlib itself; the modules that need them do.
"""

from evaluation.budget import Budget, SplitRule
from evaluation.config import EvalConfig, Run

__all__ = ["Budget", "EvalConfig", "Run", "SplitRule"]
