"""`snapstream eval`: RULER-style retrieval accuracy of cache policies across budgets.

- :mod:`~evaluation.budget`: budgets (fraction of the context or token count) and the
  rule that splits one into ``n_sink | n_topk | n_recent``;
- :mod:`~evaluation.config`: :class:`EvalConfig`, the sample grid and its runs;
- :mod:`~evaluation.forward`: a prompt's forward, run once and compressed into any
  policy's layout (SnapKV scores computed per (observation, kernel, pooling) when first asked);
- :mod:`~evaluation.lockstep`: greedy decoding of a group of prompts under one
  layout, scored as it goes;
- :mod:`~evaluation.runner`, :mod:`~evaluation.results`,
  :mod:`~evaluation.plots`: the grid, CSV/JSON, figures;
- :mod:`~evaluation.sweep`: the cache-policy sweep that picks a model's default.

This package imports no torch or matplotlib itself; the modules that need them do.
"""

from evaluation.budget import Budget, SplitRule
from evaluation.config import EvalConfig, Run

__all__ = ["Budget", "EvalConfig", "Run", "SplitRule"]
