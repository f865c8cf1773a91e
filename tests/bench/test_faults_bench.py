"""The faults benchmark's pieces that need no cluster: its poison requests, its config, its
scenario names and its outcome tally."""

from __future__ import annotations

import time

import pytest
from google.protobuf.message import DecodeError

from bench.faults.cli import _names
from bench.faults.load import Tally, one_request
from bench.faults.poison import POISON
from bench.faults.scenarios import SCENARIOS, FaultConfig, Result, _recovered
from snapstream.client import ResourceExhausted, Unavailable
from snapstream.v1 import generation_pb2

UNPARSEABLE = {"invalid UTF-8 prompt", "invalid UTF-8 stop", "truncated body"}


@pytest.mark.parametrize("name", POISON)
def test_each_poison_body_is_what_its_name_says(name: str) -> None:
    if name in UNPARSEABLE:
        with pytest.raises(DecodeError):
            generation_pb2.GenerateRequest.FromString(POISON[name])
    else:
        generation_pb2.GenerateRequest.FromString(POISON[name])


def test_scenarios_are_named_and_an_unknown_one_is_refused() -> None:
    assert _names("soak, poison") == ("soak", "poison")
    assert set(SCENARIOS) == {"decode-kills", "prefill-kills", "store-restarts", "poison",
                              "tenants", "deadlines", "soak"}
    with pytest.raises(ValueError, match="unknown scenario"):
        _names("decode-kills,meteor")


@pytest.mark.parametrize(("fields", "name"), [({"decode_kills": -1}, "decode_kills"),
                                              ({"soak_s": 0}, "soak_s"),
                                              ({"streams": 0}, "streams")])
def test_config_names_a_bad_field(fields, name) -> None:
    with pytest.raises(ValueError, match=name):
        FaultConfig(**fields)


def test_tally_counts_every_outcome() -> None:
    tally = Tally(ok=3, different=1, hung=1)
    tally.lost.update({"UNAVAILABLE": 2, "INTERNAL": 1})
    assert tally.total == 8
    assert tally.lost_line() == "UNAVAILABLE 2, INTERNAL 1"


def test_each_recovery_is_counted_and_shown(capsys) -> None:
    result = Result("decode kills", 0, Tally())
    result.faults = 1
    _recovered(result, 2.5, 3)
    result.faults = 2
    _recovered(result, None, 3)
    assert result.recoveries_s == [2.5] and result.unrecovered == 1
    assert result.recovery() == "2.5 / 2.5 (1 never)"
    assert capsys.readouterr().err.splitlines() == [
        "  decode kills 1/3: recovered in 2.5 s", "  decode kills 2/3: never recovered"]


class _Refusing:
    """A client whose every call ends as the router ends an overloaded one."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def generate(self, *args, **kwargs):
        raise self.error


async def test_overload_is_refused_not_lost_and_the_hint_is_waited_out() -> None:
    tally = Tally()
    refused = ResourceExhausted("every prefill worker's queue is full", retry_after_s=0.2)
    start = time.monotonic()
    await one_request(_Refusing(refused), "p", (), 4, 10.0, tally)
    assert time.monotonic() - start >= 0.2  # the server's hint, not the default 0.25 s
    await one_request(_Refusing(Unavailable("store down")), "p", (), 4, 10.0, tally)
    assert tally.refused == 1 and dict(tally.lost) == {"UNAVAILABLE": 1}
    assert tally.total == 2 and tally.lost_examples == {"UNAVAILABLE": "store down"}
