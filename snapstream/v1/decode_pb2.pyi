import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from snapstream.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DecodeRequest(_message.Message):
    __slots__ = ("request_id", "blob_key", "first_token_id", "generated_token_ids", "sampling", "max_new_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOB_KEY_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    blob_key: str
    first_token_id: int
    generated_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    max_new_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., blob_key: _Optional[str] = ..., first_token_id: _Optional[int] = ..., generated_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., max_new_tokens: _Optional[int] = ...) -> None: ...

class DecodeResponse(_message.Message):
    __slots__ = ("chunk", "complete")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    chunk: DecodeChunk
    complete: DecodeComplete
    def __init__(self, chunk: _Optional[_Union[DecodeChunk, _Mapping]] = ..., complete: _Optional[_Union[DecodeComplete, _Mapping]] = ...) -> None: ...

class DecodeChunk(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DecodeComplete(_message.Message):
    __slots__ = ("finish_reason", "prompt_tokens", "completion_tokens", "queue_time", "load_time", "decode_time", "simulated_decode_time")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_TIME_FIELD_NUMBER: _ClassVar[int]
    LOAD_TIME_FIELD_NUMBER: _ClassVar[int]
    DECODE_TIME_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_DECODE_TIME_FIELD_NUMBER: _ClassVar[int]
    finish_reason: _common_pb2.FinishReason
    prompt_tokens: int
    completion_tokens: int
    queue_time: _duration_pb2.Duration
    load_time: _duration_pb2.Duration
    decode_time: _duration_pb2.Duration
    simulated_decode_time: _duration_pb2.Duration
    def __init__(self, finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., queue_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., load_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., decode_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., simulated_decode_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("total_rows", "free_rows", "running", "queue_depth", "model_fingerprint")
    TOTAL_ROWS_FIELD_NUMBER: _ClassVar[int]
    FREE_ROWS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    total_rows: int
    free_rows: int
    running: int
    queue_depth: int
    model_fingerprint: str
    def __init__(self, total_rows: _Optional[int] = ..., free_rows: _Optional[int] = ..., running: _Optional[int] = ..., queue_depth: _Optional[int] = ..., model_fingerprint: _Optional[str] = ...) -> None: ...
