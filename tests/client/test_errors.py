"""Status codes map to typed exceptions; streams fold into chunks and one Completion."""

from __future__ import annotations

import grpc
import pytest

from snapstream.client import (
    ERRORS,
    Cancelled,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    ModelInfo,
    ResourceExhausted,
    SnapstreamError,
    Unavailable,
)
from snapstream.client.errors import error_from_rpc, mapped_errors
from snapstream.client.results import Chunk, CompletionBuilder
from snapstream.v1 import common_pb2, generation_pb2
from tests.client.fake_router import INFO


class FailedCall(grpc.RpcError):
    """What a failed sync call raises: an RpcError with code() and details()."""

    def __init__(self, code: grpc.StatusCode, details: str | None) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str | None:
        return self._details


@pytest.mark.parametrize(("code", "cls"), [
    (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhausted),
    (grpc.StatusCode.UNAVAILABLE, Unavailable),
    (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceeded),
    (grpc.StatusCode.CANCELLED, Cancelled),
    (grpc.StatusCode.INTERNAL, Internal),
])
def test_each_status_code_raises_its_class_with_code_and_details(code, cls) -> None:
    error = error_from_rpc(FailedCall(code, "max_new_tokens: must be >= 1"))
    assert type(error) is cls and isinstance(error, SnapstreamError)
    assert error.code == code and error.details == "max_new_tokens: must be >= 1"
    assert str(error) == f"{code.name}: max_new_tokens: must be >= 1"


def test_registry_holds_one_class_per_code() -> None:
    assert all(cls.code == code for code, cls in ERRORS.items())
    assert len(set(ERRORS.values())) == len(ERRORS)


def test_a_code_without_a_class_keeps_its_code_on_the_base_class() -> None:
    error = error_from_rpc(FailedCall(grpc.StatusCode.DATA_LOSS, None))
    assert type(error) is SnapstreamError
    assert error.code == grpc.StatusCode.DATA_LOSS and error.details == "DATA_LOSS"


def test_mapped_errors_reraises_typed_and_keeps_the_cause() -> None:
    call = FailedCall(grpc.StatusCode.UNAVAILABLE, "connection refused")
    with pytest.raises(Unavailable, match="connection refused") as info, mapped_errors():
        raise call
    assert info.value.__cause__ is call


def _chunk(ids: list[int]) -> generation_pb2.GenerateResponse:
    return generation_pb2.GenerateResponse(
        chunk=generation_pb2.GenerateChunk(token_ids=ids, text=bytes(ids).decode()))


def _complete() -> generation_pb2.GenerateResponse:
    complete = generation_pb2.GenerateComplete(
        finish_reason=common_pb2.FINISH_REASON_STOP_STRING, prompt_tokens=9,
        completion_tokens=3)
    complete.time_to_first_token.FromMilliseconds(250)
    complete.decode_time.FromNanoseconds(1_500_000_000)
    return generation_pb2.GenerateResponse(complete=complete)


def test_builder_returns_chunks_then_a_completion_of_all_of_them() -> None:
    builder = CompletionBuilder()
    assert builder.add(_chunk([104, 105])) == Chunk((104, 105), "hi")
    assert builder.add(_chunk([33])) == Chunk((33,), "!")
    assert builder.add(_complete()) is None
    completion = builder.finish()
    assert (completion.text, completion.token_ids) == ("hi!", (104, 105, 33))
    assert completion.finish_reason == "stop_string"
    assert (completion.prompt_tokens, completion.completion_tokens) == (9, 3)
    assert completion.time_to_first_token_s == pytest.approx(0.25)
    assert completion.decode_time_s == pytest.approx(1.5)


def test_builder_rejects_a_stream_that_breaks_the_protocol() -> None:
    builder = CompletionBuilder()
    builder.add(_chunk([104]))
    with pytest.raises(Internal, match="without a GenerateComplete"):
        builder.finish()
    builder.add(_complete())
    with pytest.raises(Internal, match="after GenerateComplete"):
        builder.add(_chunk([105]))


def test_model_info_resolves_the_default_policy() -> None:
    info = ModelInfo.from_pb(INFO)
    assert (info.model_name, info.context_length, info.eos_token_ids) == ("fake", 4096, (257,))
    policy = info.default_policy
    assert (policy.kind, policy.pooling, policy.n_topk, policy.n_recent) == (
        "snapstream", "max", 64, 32)


def test_model_info_with_an_unresolved_policy_is_an_internal_error() -> None:
    with pytest.raises(Internal, match="default_policy"):
        ModelInfo.from_pb(generation_pb2.InfoResponse(model_name="fake"))
