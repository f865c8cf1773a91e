"""Chat requests built by the SDK: the messages oneof, options, and shapes it refuses."""

from __future__ import annotations

import pytest

from snapstream.client import InvalidArgument, build_chat_request


def test_messages_fill_the_oneof_with_the_options():
    request = build_chat_request([{"role": "system", "content": "brief"},
                                  {"role": "user", "content": "hi"}],
                                 max_new_tokens=8, temperature=0.0, policy="snapstream")
    assert request.WhichOneof("input") == "messages"
    assert [(m.role, m.content) for m in request.messages.messages] == [
        ("system", "brief"), ("user", "hi")]
    assert request.max_new_tokens == 8 and request.policy.kind == 4


def test_an_empty_conversation_still_selects_messages():
    assert build_chat_request([]).WhichOneof("input") == "messages"  # the server names it


@pytest.mark.parametrize("message", [{"role": "user"}, {"role": "user", "content": 3},
                                     ("user", "hi"), {"role": "user", "content": "x", "n": 1}])
def test_malformed_messages_are_refused_with_their_index(message):
    with pytest.raises(InvalidArgument, match=r"messages\[1\]"):
        build_chat_request([{"role": "user", "content": "ok"}, message])
