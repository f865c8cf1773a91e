"""A request's CachePolicy message against the model's default: unset fields, kinds, errors."""

import pytest

from serving.convert import policy_from_pb, policy_to_pb
from serving.errors import RequestError
from snapstream.policy import CachePolicy
from snapstream.v1 import common_pb2

SINKLESS = CachePolicy(kind="snapstream", n_sink=0, n_topk=768, n_recent=256, observation=16,
                       kernel=31)


def test_an_empty_message_is_the_default():
    assert policy_from_pb(common_pb2.CachePolicy(), SINKLESS) == SINKLESS
    assert policy_from_pb(policy_to_pb(SINKLESS), CachePolicy()) == SINKLESS


def test_streaming_with_its_sinks_unset_is_streamingllm():
    msg = common_pb2.CachePolicy(kind=common_pb2.POLICY_KIND_STREAMING)
    policy = policy_from_pb(msg, SINKLESS)
    assert (policy.kind, policy.n_sink, policy.n_topk, policy.n_recent) == (
        "streaming", 4, 768, 256)
    msg.n_sink = 0
    assert policy_from_pb(msg, SINKLESS).n_sink == 0  # what the request asks for


def test_a_bad_field_is_named():
    msg = common_pb2.CachePolicy(kind=common_pb2.POLICY_KIND_STREAMING, kernel=4)
    with pytest.raises(RequestError, match="policy: kernel"):
        policy_from_pb(msg, SINKLESS)


def test_observing_the_opening_round_trips():
    opening = CachePolicy(observe="opening", kernel=15)
    assert policy_from_pb(policy_to_pb(opening), SINKLESS) == opening
    msg = common_pb2.CachePolicy(observe=common_pb2.OBSERVE_OPENING)
    assert policy_from_pb(msg, SINKLESS).observe == "opening"


def test_keeping_words_round_trips():
    words = CachePolicy(unit="word", kernel=15)
    assert policy_from_pb(policy_to_pb(words), SINKLESS) == words
    msg = common_pb2.CachePolicy(unit=common_pb2.UNIT_WORD)
    assert policy_from_pb(msg, SINKLESS).unit == "word"


@pytest.mark.parametrize("name", ["kind", "pooling", "observe", "unit"])
def test_an_unknown_enum_value_is_named(name):
    msg = common_pb2.CachePolicy(**{name: 9})
    with pytest.raises(RequestError, match=f"policy.{name}: unknown value 9"):
        policy_from_pb(msg, SINKLESS)
