"""Cache budgets and the rule that splits one into ``n_sink | n_topk | n_recent``.

A budget is written either as a fraction of the cell's context length (``1/4``, ``0.125``) or as
an absolute token count (``256``, any integer). The split, for a budget of ``B`` tokens:

- ``n_sink = min(n_sink, B - 1)`` (default 4; ``streaming`` always has its own sinks,
  StreamingLLM's 4 (``KIND_OWN_FIELDS``), whatever the rule's: without them its window
  attention breaks down once the first tokens leave it, and the rule's sinks are tuned for
  SnapKV, which keeps them by score),
- ``observation = min(observation, B - n_sink)`` (SnapKV's observation window, default 32),
- ``n_recent = min(B - n_sink, max(observation, round(B * recent_fraction)))`` (default 0.25; 0
  keeps the observation window alone), so the ring always holds the observation window, i.e.
  the question
  when it comes last,
- ``n_topk = B - n_sink - n_recent`` (SnapKV picks; ``streaming`` spends them on its ring).

Every policy at one budget holds the same number of tokens; ``full`` ignores the budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from snapstream.policy import KIND_OWN_FIELDS, CachePolicy


@dataclass(frozen=True)
class Budget:
    """A budget as given on the command line: ``fraction`` of the context, or ``tokens``."""

    label: str
    fraction: Fraction | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.tokens is None):
            raise ValueError(f"budgets: {self.label!r} needs exactly one of fraction or tokens")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"budgets: fraction {self.label!r} must lie in (0, 1]")
        if self.tokens is not None and self.tokens < 1:
            raise ValueError(f"budgets: token count {self.label!r} must be >= 1")

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``"256"`` -> 256 tokens; ``"1/4"`` or ``"0.25"`` -> a quarter of the context."""
        text = text.strip()
        if text.isdigit():
            return cls(label=text, tokens=int(text))
        try:
            fraction = Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"budgets: {text!r} is neither a token count (256) nor a fraction "
                             "of the context (1/4, 0.25)") from None
        return cls(label=text, fraction=fraction)

    def tokens_for(self, context_len: int) -> int:
        if self.tokens is not None:
            return self.tokens
        return max(1, round(self.fraction * context_len))


@dataclass(frozen=True)
class SplitRule:
    """How a budget of ``B`` tokens becomes a :class:`CachePolicy` (module docstring)."""

    n_sink: int = 4
    observation: int = 32
    recent_fraction: float = 0.25
    kernel: int = 5
    pooling: str = "avg"
    observe: str = "last"
    unit: str = "token"

    def __post_init__(self) -> None:
        if self.n_sink < 0:
            raise ValueError(f"n_sink must be >= 0, got {self.n_sink}")
        if self.observation < 1:
            raise ValueError(f"observation must be >= 1, got {self.observation}")
        if not 0.0 <= self.recent_fraction <= 1.0:
            raise ValueError(f"recent_fraction must lie in [0, 1], got {self.recent_fraction}")
        CachePolicy(kernel=self.kernel, pooling=self.pooling, observe=self.observe,
                    unit=self.unit)  # their checks name the field

    @classmethod
    def from_policy(cls, policy: CachePolicy) -> SplitRule:
        """The rule that splits any budget the way ``policy`` splits its own (a model's
        default policy: its ring's share of the budget, sinks, observation window and pooling)."""
        return cls(n_sink=policy.n_sink, observation=policy.observation,
                   recent_fraction=round(policy.n_recent / policy.budget, 4),
                   kernel=policy.kernel, pooling=policy.pooling, observe=policy.observe,
                   unit=policy.unit)

    def policy(self, kind: str, budget: int) -> CachePolicy:
        """``kind`` at ``budget`` tokens; ``full`` keeps the SnapKV settings and default sizes."""
        if kind == "full":
            return CachePolicy(kind="full", observation=self.observation, kernel=self.kernel,
                               pooling=self.pooling, observe=self.observe, unit=self.unit)
        if budget < 2:
            raise ValueError(f"budgets: a budget of {budget} token(s) leaves no room for a ring")
        n_sink = min(KIND_OWN_FIELDS.get(kind, {}).get("n_sink", self.n_sink), budget - 1)
        observation = min(self.observation, budget - n_sink)
        n_recent = min(budget - n_sink, max(observation, round(budget * self.recent_fraction)))
        return CachePolicy(kind=kind, n_sink=n_sink, n_topk=budget - n_sink - n_recent,
                           n_recent=n_recent, observation=observation, kernel=self.kernel,
                           pooling=self.pooling, observe=self.observe, unit=self.unit)
