"""`snapstream eval`: RULER-style retrieval accuracy of cache policies across budgets.

- :mod:`~snapstream.evaluate.budget`: budgets (fraction of the context or token count) and the
  rule that splits one into ``n_sink | n_topk | n_recent``;
- :mod:`~snapstream.evaluate.config`: :class:`EvalConfig`, the sample grid and its runs;
- :mod:`~snapstream.evaluate.forward`: a prompt's forward, run once and compressed into any
  policy's layout (SnapKV scores computed per (window, kernel, pooling) when first asked);
- :mod:`~snapstream.evaluate.lockstep`: greedy decoding of a group of prompts under one
  layout, scored as it goes;
- :mod:`~snapstream.evaluate.runner`, :mod:`~snapstream.evaluate.results`,
  :mod:`~snapstream.evaluate.plots`: the grid, CSV/JSON, figures;
- :mod:`~snapstream.evaluate.sweep`: the cache-policy sweep that picks a model's default.

This package imports no torch or matplotlib itself; the modules that need them do.
"""

from snapstream.evaluate.budget import Budget, SplitRule
from snapstream.evaluate.config import EvalConfig, Run

__all__ = ["Budget", "EvalConfig", "Run", "SplitRule"]
