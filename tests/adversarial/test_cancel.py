"""A cancelled request's model work stops at its next check: the draft's forward and look-ahead
steps, the target's prefill, each before its next layer (``snapstream.cancel``)."""

from __future__ import annotations

import pytest

from snapstream.cancel import Cancel, Cancelled
from snapstream.engine import Engine
from snapstream.specprefill.scoring import score_prompt
from tests.integration.test_services import ENGINE_POLICY

DOCUMENT = " ".join(f"Item {i} costs {i * 37 % 1000} coins." for i in range(60))


class CancelAfter(Cancel):
    """Sets itself at its ``checks``-th check, as a request cancelled mid-forward."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.checks, self.seen = checks, 0

    def check(self) -> None:
        self.seen += 1
        if self.seen == self.checks:
            self.set()
        super().check()


def test_a_cancelled_draft_stops_at_its_next_step(draft: Engine):
    """The look-ahead stops within a step: of 16 asked, the checks stop at the cancel."""
    ids = draft.tokenizer.encode(DOCUMENT)
    layers = draft.config.num_layers
    cancel = CancelAfter(layers + 3)  # the prompt's forward, then the first step's 2nd layer
    with pytest.raises(Cancelled):
        score_prompt(draft.model, ids, 16, 13, set(), cancel=cancel)
    assert cancel.seen == layers + 3


def test_a_cancelled_prefill_stops_at_its_next_layer(tiny_model_dir):
    engine = Engine.from_pretrained(tiny_model_dir)
    cancel = CancelAfter(2)
    with pytest.raises(Cancelled):
        engine.prefill(engine.encode(DOCUMENT), ENGINE_POLICY, 4, cancel=cancel)
    assert cancel.seen == 2 < engine.config.num_layers + 1
