"""`snapstream eval`: RULER-style retrieval accuracy of cache policies across budgets.

- :mod:`~snapstream.evaluate.budget`: budgets (fraction of the context or token count) and the
  rule that splits one into ``n_sink | n_topk | n_recent``;
- :mod:`~snapstream.evaluate.config`: :class:`EvalConfig`, the sample grid and its runs;
- :mod:`~snapstream.evaluate.shared_prefill`: an engine that runs each prompt's forward once
  for all its policies;
- :mod:`~snapstream.evaluate.runner`, :mod:`~snapstream.evaluate.results`,
  :mod:`~snapstream.evaluate.plots`: decode and score, CSV/JSON, figures.

This package imports no torch or matplotlib itself; the modules that need them do.
"""

from snapstream.evaluate.budget import Budget, SplitRule
from snapstream.evaluate.config import EvalConfig, Run

__all__ = ["Budget", "EvalConfig", "Run", "SplitRule"]
