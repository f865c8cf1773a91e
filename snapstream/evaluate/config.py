"""What one evaluation covers: the sample grid, the policies and budgets, and how to decode."""

from __future__ import annotations

from dataclasses import dataclass, field

from snapstream.data import (
    MAX_ANSWER_LEN,
    TASKS,
    Placement,
    Sample,
    Split,
    TaskConfig,
    build_eval_set,
)
from snapstream.data.sample import MIN_CONTEXT_LEN
from snapstream.evaluate.budget import Budget, SplitRule
from snapstream.policy import POLICY_KINDS, CachePolicy

FULL = "full"


@dataclass(frozen=True)
class Run:
    """One policy at one budget on one context length; ``budget`` is None for ``full``."""

    policy: CachePolicy
    budget: Budget | None
    budget_tokens: int | None


def _check_names(name: str, values: tuple[str, ...], known) -> None:
    if not values:
        raise ValueError(f"{name} must not be empty")
    unknown = [v for v in values if v not in known]
    if unknown:
        raise ValueError(f"{name}: unknown {unknown} (use {', '.join(known)})")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} has duplicates: {list(values)}")


def _coerce_enum(name: str, enum, values) -> tuple:
    allowed = [member.value for member in enum]
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(f"{name}: unknown {bad} (use {', '.join(allowed)})")
    return tuple(enum(v) for v in values)


@dataclass(frozen=True)
class EvalConfig:
    """Grid of ``tasks x context_lens x depths x placements x n_per_cell`` samples (generated
    from ``seed``), each decoded greedily under every policy in ``policies`` at every budget
    (``full`` once). ``limit`` keeps that many samples spread evenly over the grid."""

    tasks: tuple[str, ...] = tuple(TASKS)
    context_lens: tuple[int, ...] = (1024, 2048)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    placements: tuple[Placement, ...] = tuple(Placement)
    policies: tuple[str, ...] = tuple(POLICY_KINDS)
    budgets: tuple[Budget, ...] = tuple(Budget.parse(b) for b in ("1/2", "1/4", "1/8"))
    n_per_cell: int = 4
    seed: int = 0
    split: Split = Split.HELDOUT
    num_distractors: int = 3
    num_hops: int = 2
    max_new_tokens: int = 12
    # tokens between the question and the answer cue, decoded through the cache as if generated
    # (held-out filler): a long generation that pushes the question out of the recent ring
    gap_tokens: int = 0
    split_rule: SplitRule = field(default_factory=SplitRule)
    limit: int | None = None

    def __post_init__(self) -> None:
        for name in ("tasks", "context_lens", "depths", "policies", "budgets"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        _check_names("tasks", self.tasks, tuple(TASKS))
        _check_names("policies", self.policies, tuple(POLICY_KINDS))
        object.__setattr__(self, "placements",
                           _coerce_enum("placements", Placement, self.placements))
        object.__setattr__(self, "split", _coerce_enum("split", Split, (self.split,))[0])
        if not self.placements or len(set(self.placements)) != len(self.placements):
            raise ValueError(f"placements must be distinct and not empty: {self.placements}")
        if not self.context_lens or min(self.context_lens) < MIN_CONTEXT_LEN:
            raise ValueError(f"context_lens must be >= {MIN_CONTEXT_LEN} tokens each, got "
                             f"{self.context_lens}")
        if not self.depths or not all(0.0 <= d <= 1.0 for d in self.depths):
            raise ValueError(f"depths must lie in [0, 1], got {self.depths}")
        if self.policies != (FULL,) and not self.budgets:
            raise ValueError("budgets must not be empty when a policy other than full is run")
        if len({b.label for b in self.budgets}) != len(self.budgets):
            raise ValueError(f"budgets has duplicates: {[b.label for b in self.budgets]}")
        if self.n_per_cell < 1:
            raise ValueError(f"n_per_cell must be >= 1, got {self.n_per_cell}")
        if self.max_new_tokens < MAX_ANSWER_LEN + 1:
            raise ValueError(f"max_new_tokens must be >= {MAX_ANSWER_LEN + 1} (the longest "
                             f"answer plus its terminator), got {self.max_new_tokens}")
        if self.gap_tokens < 0:
            raise ValueError(f"gap_tokens must be >= 0, got {self.gap_tokens}")
        if self.gap_tokens and Placement.BEFORE in self.placements:
            raise ValueError("gap_tokens needs placements=after: with the question before the "
                             "context, the context already separates it from the answer")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        TaskConfig(context_len=MIN_CONTEXT_LEN, num_distractors=self.num_distractors,
                   num_hops=self.num_hops)  # its checks name the field
        for context_len in self.context_lens:
            self.runs(context_len)  # every budget must split into a valid policy

    def runs(self, context_len: int) -> list[Run]:
        """Every (policy, budget) pair evaluated on a sample of ``context_len``, in order."""
        runs = []
        for kind in self.policies:
            if kind == FULL:
                runs.append(Run(self.split_rule.policy(FULL, 0), None, None))
                continue
            for budget in self.budgets:
                tokens = budget.tokens_for(context_len)
                runs.append(Run(self.split_rule.policy(kind, tokens), budget, tokens))
        return runs

    def samples(self) -> list[Sample]:
        samples = build_eval_set(
            tasks=self.tasks, context_lens=self.context_lens, depths=self.depths,
            placements=self.placements, n_per_cell=self.n_per_cell, seed=self.seed,
            split=self.split, num_distractors=self.num_distractors, num_hops=self.num_hops)
        if self.limit is None or self.limit >= len(samples):
            return samples
        return [samples[i * len(samples) // self.limit] for i in range(self.limit)]

    def to_json(self) -> dict:
        return {
            "tasks": list(self.tasks), "context_lens": list(self.context_lens),
            "depths": list(self.depths), "placements": [str(p) for p in self.placements],
            "policies": list(self.policies), "budgets": [b.label for b in self.budgets],
            "n_per_cell": self.n_per_cell, "seed": self.seed, "split": str(self.split),
            "num_distractors": self.num_distractors, "num_hops": self.num_hops,
            "max_new_tokens": self.max_new_tokens, "gap_tokens": self.gap_tokens,
            "n_sink": self.split_rule.n_sink,
            "window": self.split_rule.window, "recent_fraction": self.split_rule.recent_fraction,
            "kernel": self.split_rule.kernel, "pooling": self.split_rule.pooling,
            "limit": self.limit,
        }
