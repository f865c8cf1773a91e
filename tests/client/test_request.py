"""GenerateRequest building: unset options stay unset so the server's defaults apply."""

from __future__ import annotations

import pytest

from snapstream.client import InvalidArgument, build_chat_request, build_request
from snapstream.v1 import common_pb2


def test_unset_options_leave_every_optional_field_unset() -> None:
    request = build_request("hello")
    assert request.WhichOneof("input") == "prompt" and request.prompt == "hello"
    assert not request.HasField("max_new_tokens")
    for field in ("temperature", "top_k", "top_p", "seed"):
        assert not request.sampling.HasField(field), field
    for field in ("n_sink", "n_topk", "n_recent", "observation", "kernel"):
        assert not request.policy.HasField(field), field
    assert request.policy.kind == common_pb2.POLICY_KIND_UNSPECIFIED
    assert request.policy.pooling == common_pb2.POOLING_UNSPECIFIED


def test_zero_values_are_sent_as_set() -> None:
    """temperature 0 (greedy) differs from unset (the server's default)."""
    request = build_request("x", temperature=0.0, top_k=0, seed=0, max_new_tokens=0)
    assert request.sampling.HasField("temperature") and request.sampling.temperature == 0.0
    assert request.sampling.HasField("top_k") and request.sampling.HasField("seed")
    assert request.HasField("max_new_tokens")


def test_every_option_reaches_its_field() -> None:
    request = build_request(
        "x", max_new_tokens=7, temperature=0.5, top_k=40, top_p=0.9, seed=2**40,
        stop=("\n", "END"), stop_token_ids=(257,), policy="streaming", n_sink=2, n_topk=16,
        n_recent=8, observation=4, kernel=3, pooling="max", observe="opening", unit="word")
    assert request.max_new_tokens == 7
    sampling = request.sampling
    assert (sampling.temperature, sampling.top_k, sampling.seed) == (0.5, 40, 2**40)
    assert sampling.top_p == pytest.approx(0.9)
    assert list(sampling.stop) == ["\n", "END"] and list(sampling.stop_token_ids) == [257]
    policy = request.policy
    assert policy.kind == common_pb2.POLICY_KIND_STREAMING
    assert policy.pooling == common_pb2.POOLING_MAX
    assert policy.observe == common_pb2.OBSERVE_OPENING
    assert policy.unit == common_pb2.UNIT_WORD
    assert (policy.n_sink, policy.n_topk, policy.n_recent, policy.observation, policy.kernel) == (
        2, 16, 8, 4, 3)


def test_a_single_stop_string_is_one_stop_string() -> None:
    assert list(build_request("x", stop="END").sampling.stop) == ["END"]


@pytest.mark.parametrize("prompt", [[72, 105], (72, 105), []])
def test_token_ids_select_the_token_input_even_when_empty(prompt) -> None:
    request = build_request(prompt)
    assert request.WhichOneof("input") == "prompt_token_ids"
    assert list(request.prompt_token_ids.ids) == list(prompt)


def test_policy_names_come_from_the_proto_enum() -> None:
    for name, kind in [("full", common_pb2.POLICY_KIND_FULL),
                       ("snapkv", common_pb2.POLICY_KIND_SNAPKV),
                       ("snapstream", common_pb2.POLICY_KIND_SNAPSTREAM)]:
        assert build_request("x", policy=name).policy.kind == kind


@pytest.mark.parametrize(("options", "message"), [
    ({"policy": "lru"}, "policy must be one of full, streaming, snapkv, snapstream, got 'lru'"),
    ({"pooling": "mean"}, "pooling must be one of avg, max, got 'mean'"),
    ({"observe": "first"}, "observe must be one of last, opening, got 'first'"),
    ({"unit": "line"}, "unit must be one of token, word, got 'line'"),
    ({"max_new_tokens": -1}, "max_new_tokens=-1"),
    ({"n_topk": 2**32}, "n_topk=4294967296"),
    ({"temperature": "hot"}, "temperature='hot'"),
])
def test_values_the_message_cannot_hold_raise_invalid_argument(options, message) -> None:
    with pytest.raises(InvalidArgument) as info:
        build_request("x", **options)
    assert info.value.details.startswith(message), info.value.details


def test_negative_token_ids_raise_invalid_argument_naming_the_prompt() -> None:
    with pytest.raises(InvalidArgument) as info:
        build_request([1, -2])
    assert info.value.details.startswith("prompt: ")


def test_an_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"unknown generate option\(s\): max_tokens"):
        build_request("x", max_tokens=3)


def test_a_reusable_document_is_marked_as_asked() -> None:
    chat = build_chat_request([{"role": "system", "content": "doc"},
                               {"role": "user", "content": "q?"}], cache_prefix="system")
    assert chat.cache_prefix == "system"
    text = build_request("doc q?", cache_prefix_chars=3)
    assert text.cache_prefix_chars == 3 and not text.cache_prefix
    with pytest.raises(InvalidArgument):
        build_request("doc q?", cache_prefix_chars=-1)
