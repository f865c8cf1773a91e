"""The faults benchmark's pieces that need no cluster: its poison requests, its config, its
scenario names and its outcome tally."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from snapstream.bench.faults.cli import _names
from snapstream.bench.faults.load import Tally
from snapstream.bench.faults.poison import POISON
from snapstream.bench.faults.scenarios import SCENARIOS, FaultConfig
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
    assert set(SCENARIOS) == {"decode-kills", "prefill-kills", "store-restarts", "poison", "soak"}
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
