"""The accuracy targets of the long-context grid, checked per cell (task, context length,
question placement, gap) where the full cache answers at least ``MIN_FULL`` of the samples.

A target asks a run (policy at a budget) for at least ``min_ratio`` times the accuracy of a
reference: the full cache, or another policy at the same budget (``min_ratio`` 1: at least as
accurate as it). Targets whose run or reference the grid lacks are not checked. Token parity
with kvpress's SnapKV is measured apart (evaluation.press_compare), not here.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_FULL = 0.5
FULL = "full"


@dataclass(frozen=True)
class Target:
    policy: str
    budget: str
    reference: str  # "full", or a policy at the same budget
    min_ratio: float
    tasks: tuple[str, ...] | None = None  # None: every task not in ``skip``
    skip: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.min_ratio <= 0:
            raise ValueError(f"min_ratio must be > 0, got {self.min_ratio}")

    @property
    def label(self) -> str:
        where = (f" on {', '.join(self.tasks)}" if self.tasks
                 else f" except {', '.join(self.skip)}" if self.skip else "")
        reference = FULL if self.reference == FULL else f"{self.reference} {self.budget}"
        return f"{self.policy} {self.budget} >= {self.min_ratio:g} x {reference}{where}"

    def covers(self, task: str) -> bool:
        return (self.tasks is None or task in self.tasks) and task not in self.skip


TARGETS = (
    Target("snapstream", "1/4", FULL, 0.95, skip=("paraphrase",)),
    Target("snapstream", "1/4", FULL, 0.90, tasks=("paraphrase",)),
    Target("snapstream", "1/8", FULL, 0.85),
    Target("snapstream", "1/4", "streaming", 1.0),
    Target("snapstream", "1/8", "streaming", 1.0),
    Target("snapstream", "1/4", "openvino-evict", 1.0),
    Target("snapstream", "1/8", "openvino-evict", 1.0),
)


def check_targets(by_cell: list[dict], targets: tuple[Target, ...] = TARGETS) -> list[dict]:
    """Per target and cell (``by_cell``: summary.json's ``by_task_length`` entries) where the
    full cache reaches ``MIN_FULL``: the run's accuracy, the reference's and whether it is met."""
    accuracy = {(e["task"], e["context_len"], e["placement"], e["gap"], e["policy"],
                 e["budget_label"]): e["accuracy"] for e in by_cell}
    cells = dict.fromkeys((e["task"], e["context_len"], e["placement"], e["gap"])
                          for e in by_cell)
    checks = []
    for target in targets:
        for cell in cells:
            full = accuracy.get((*cell, FULL, None))
            run = accuracy.get((*cell, target.policy, target.budget))
            reference = full if target.reference == FULL else accuracy.get(
                (*cell, target.reference, target.budget))
            if (not target.covers(cell[0]) or full is None or full < MIN_FULL or run is None
                    or reference is None):
                continue
            checks.append({"target": target.label, "task": cell[0], "context_len": cell[1],
                           "placement": cell[2], "gap": cell[3], "accuracy": run,
                           "reference": reference,
                           "is_met": run >= target.min_ratio * reference})
    return checks


def targets_table(checks: list[dict]) -> str:
    """Markdown: per target, the cells checked and met, and the cells missed."""
    from bench.report import markdown_table

    body = []
    for label in dict.fromkeys(c["target"] for c in checks):
        mine = [c for c in checks if c["target"] == label]
        missed = [f"{c['task']} {c['context_len']} {c['placement']} "
                  f"({c['accuracy']:.2f} vs {c['reference']:.2f})"
                  for c in mine if not c["is_met"]]
        body.append([label, f"{sum(c['is_met'] for c in mine)}/{len(mine)}",
                     "; ".join(missed) or "-"])
    return ("targets, where the full cache answers at least half\n"
            + markdown_table(["target", "cells met", "missed"], body))
