"""The SDK's ``speculative`` option: set (even empty) asks for speculative prefill; each key
reaches its field; unknown keys and values the message cannot hold are refused."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration

from snapstream.client import InvalidArgument, build_chat_request, build_request
from snapstream.client.results import CompletionBuilder, SpeculativeUsage
from snapstream.v1 import common_pb2, generation_pb2


def test_speculative_is_unset_unless_given_and_empty_asks_for_the_workers_defaults():
    assert not build_request("x").HasField("speculative")
    asked = build_request("x", speculative={})
    assert asked.HasField("speculative") and asked.speculative.WhichOneof("size") is None
    chat = build_chat_request([{"role": "user", "content": "hi"}], speculative={"keep": 0.5})
    assert chat.speculative.keep == 0.5


def test_every_key_reaches_its_field():
    request = build_request("x", speculative={"keep_tokens": 900, "chunk_size": 16,
                                              "look_ahead": 4, "positions": "compact"})
    msg = request.speculative
    assert msg.WhichOneof("size") == "keep_tokens" and msg.keep_tokens == 900
    assert (msg.chunk_size, msg.look_ahead) == (16, 4)
    assert msg.positions == common_pb2.POSITION_MODE_COMPACT


@pytest.mark.parametrize(("given", "message"), [
    ({"share": 0.2}, "unknown key(s) share"),
    ({"positions": "shifted"}, "speculative.positions must be one of"),
    ({"chunk_size": -1}, "chunk_size=-1 cannot be sent"),
])
def test_bad_speculative_options_are_refused(given, message):
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_request("x", speculative=given)


def test_the_completion_carries_the_report():
    builder = CompletionBuilder()
    report = common_pb2.SpeculativeReport(
        draft_time=Duration(nanos=250_000_000), target_prefill_time=Duration(nanos=5_000_000),
        kept_tokens=100, prompt_tokens=400, positions=common_pb2.POSITION_MODE_COMPACT)
    builder.add(generation_pb2.GenerateResponse(complete=generation_pb2.GenerateComplete(
        prompt_tokens=400, speculative=report)))
    assert builder.finish().speculative == SpeculativeUsage(0.25, 0.005, 100, 400, "",
                                                                 "compact")
    plain = CompletionBuilder()
    plain.add(generation_pb2.GenerateResponse(complete=generation_pb2.GenerateComplete()))
    assert plain.finish().speculative is None
