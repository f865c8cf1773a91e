"""The one finish rule (snapstream.finish), as the engine, the decode worker and the router
apply it."""

from __future__ import annotations

from collections import deque

import pytest

from decode_svc.sequence import Sequence
from snapstream.finish import LENGTH, STOP_TOKEN, finish_reason
from snapstream.sampling_params import SamplingParams

STOP = frozenset({7, 9})


@pytest.mark.parametrize(("token", "count", "expected"), [
    (3, 1, None), (3, 4, None), (3, 5, LENGTH), (7, 1, STOP_TOKEN),
    (9, 5, STOP_TOKEN),  # a stop token that is also the last allowed: the stop token says why
])
def test_a_stop_token_ends_first_then_the_length(token, count, expected):
    assert finish_reason(token, count, STOP, max_new_tokens=5) == expected


def test_a_decode_sequence_counts_the_tokens_the_client_has():
    seq = Sequence(request_id="r", prompt_len=4, next_position=4, replay=deque([1, 2]),
                   max_new_tokens=3, emitted=2, sampling=SamplingParams(), stop_ids=STOP,
                   sink=None)  # type: ignore[arg-type]
    assert seq.finish_reason(2) is None  # the second of three
    seq.emitted += 1
    assert seq.finish_reason(4) == LENGTH
    assert seq.finish_reason(7) == STOP_TOKEN
