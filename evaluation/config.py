"""What one evaluation covers: the sample grid, the policies and budgets, and how to decode."""

from __future__ import annotations

from dataclasses import dataclass, field

from evaldata import (
    PROMPT_FORMATS,
    TASKS,
    Placement,
    PromptSpec,
    Sample,
    TaskConfig,
    build_eval_set,
)
from evaldata.sample import MIN_CONTEXT_LEN
from evaluation.budget import Budget, SplitRule
from snapstream.policy import POLICY_KINDS, CachePolicy
from snapstream.specprefill.settings import SpeculativeSettings

FULL = "full"
SPECULATIVE = "speculative"  # the policy name of a speculative run's rows


@dataclass(frozen=True)
class SpeculativeGrid:
    """Speculative prefill runs: ``draft`` (a model name or path) picks, for every sample,
    the target tokens prefilled at each share in ``keeps``; the target prefills them with the
    full cache, so the grid's ``full`` run is the baseline."""

    draft: str
    keeps: tuple[float, ...] = (0.1, 0.25, 0.5)
    positions: str = "original"
    chunk_size: int = 32
    look_ahead: int = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "keeps", tuple(self.keeps))
        if not self.keeps or len(set(self.keeps)) != len(self.keeps):
            raise ValueError(f"keep shares must be distinct and not empty, got {self.keeps}")
        for keep in self.keeps:
            self.settings(keep)  # its checks name the bad value

    def settings(self, keep: float) -> SpeculativeSettings:
        return SpeculativeSettings(keep=keep, chunk_size=self.chunk_size,
                                   look_ahead=self.look_ahead, positions=self.positions)

    def to_json(self) -> dict:
        return {"draft": self.draft, "keeps": list(self.keeps), "positions": self.positions,
                "chunk_size": self.chunk_size, "look_ahead": self.look_ahead}


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
    """Grid of ``tasks x context_lens x placements x n_per_cell`` samples (generated from
    ``seed``; needle depths cycle through ``depths`` within a cell), each decoded greedily at
    every gap under every policy in ``policies`` at every budget (``full`` once). ``limit``
    keeps that many samples spread evenly over the grid. ``max_group_tokens`` bounds the
    prompt tokens whose forwards are held at once (and so the decode batch). ``peers``: systems
    of bench.peers that also answer every sample at every budget (evaluation.peer_rows)."""

    tasks: tuple[str, ...] = tuple(TASKS)
    context_lens: tuple[int, ...] = (1024, 2048)
    depths: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
    placements: tuple[Placement, ...] = tuple(Placement)
    policies: tuple[str, ...] = tuple(POLICY_KINDS)
    budgets: tuple[Budget, ...] = tuple(Budget.parse(b) for b in
                                        ("1/2", "1/4", "1/8", "1/16", "256", "512", "1024"))
    n_per_cell: int = 2
    seed: int = 0
    prompt_format: str = "chat"
    num_distractors: int = 3
    num_hops: int = 2
    num_values: int = 3
    # tokens decoded between the question and the answer cue as if generated (prose filler):
    # a long generation that pushes the question out of the recent ring; 0 = the cue follows
    gaps: tuple[int, ...] = (0,)
    split_rule: SplitRule = field(default_factory=SplitRule)
    limit: int | None = None
    max_group_tokens: int = 16384
    speculative: SpeculativeGrid | None = None
    peers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("tasks", "context_lens", "depths", "policies", "budgets", "gaps"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        _check_names("tasks", self.tasks, tuple(TASKS))
        _check_names("policies", self.policies, tuple(POLICY_KINDS))
        object.__setattr__(self, "placements",
                           _coerce_enum("placements", Placement, self.placements))
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {', '.join(PROMPT_FORMATS)}, got "
                             f"{self.prompt_format!r}")
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
        if not self.gaps or min(self.gaps) < 0 or len(set(self.gaps)) != len(self.gaps):
            raise ValueError(f"gaps must be distinct token counts >= 0, got {self.gaps}")
        if max(self.gaps) and Placement.BEFORE in self.placements:
            raise ValueError("gaps need placements=after: with the question before the "
                             "context, the context already separates it from the answer")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        if self.max_group_tokens < max(self.context_lens):
            raise ValueError(f"max_group_tokens must hold the longest context "
                             f"({max(self.context_lens)}), got {self.max_group_tokens}")
        if self.speculative is not None and (self.placements != (Placement.AFTER,)
                                             or self.gaps != (0,)):
            raise ValueError("a draft model needs placements=after and gaps=0: the draft "
                             "reads the context with the question after it")
        self._check_peers()
        TaskConfig(context_len=MIN_CONTEXT_LEN, num_distractors=self.num_distractors,
                   num_hops=self.num_hops, num_values=self.num_values)  # its checks name it
        for context_len in self.context_lens:
            self.runs(context_len)  # every budget must split into a valid policy

    def _check_peers(self) -> None:
        object.__setattr__(self, "peers", tuple(self.peers))
        if not self.peers:
            return
        from bench.peers.systems import SYSTEMS

        _check_names("peers", self.peers, tuple(SYSTEMS))
        if self.gaps != (0,):
            raise ValueError("peers answer right after the prompt: they need gaps=0")
        if not self.budgets:
            raise ValueError("peers need budgets")

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

    def samples(self, tokenizer) -> list[Sample]:
        """The grid's samples, sized with ``tokenizer`` (the model's)."""
        samples = build_eval_set(
            tasks=self.tasks, context_lens=self.context_lens, depths=self.depths,
            placements=self.placements, n_per_cell=self.n_per_cell, seed=self.seed,
            spec=PromptSpec(tokenizer, self.prompt_format), num_distractors=self.num_distractors,
            num_hops=self.num_hops, num_values=self.num_values)
        if self.limit is None or self.limit >= len(samples):
            return samples
        return [samples[i * len(samples) // self.limit] for i in range(self.limit)]

    def to_json(self) -> dict:
        return {
            "tasks": list(self.tasks), "context_lens": list(self.context_lens),
            "depths": list(self.depths), "placements": [str(p) for p in self.placements],
            "policies": list(self.policies), "budgets": [b.label for b in self.budgets],
            "n_per_cell": self.n_per_cell, "seed": self.seed,
            "prompt_format": self.prompt_format, "num_distractors": self.num_distractors,
            "num_hops": self.num_hops, "num_values": self.num_values, "gaps": list(self.gaps),
            "n_sink": self.split_rule.n_sink,
            "observation": self.split_rule.observation,
            "recent_fraction": self.split_rule.recent_fraction,
            "kernel": self.split_rule.kernel, "pooling": self.split_rule.pooling,
            "observe": self.split_rule.observe, "unit": self.split_rule.unit,
            "limit": self.limit,
            "speculative": None if self.speculative is None else self.speculative.to_json(),
            "peers": list(self.peers),
        }
