import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from snapstream.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "policy", "sampling", "max_new_tokens", "blob_key", "prefix_tokens", "speculative", "speculative_prompt", "tenant", "cache_salt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOB_KEY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    policy: _common_pb2.CachePolicy
    sampling: _common_pb2.SamplingParams
    max_new_tokens: int
    blob_key: str
    prefix_tokens: int
    speculative: _common_pb2.SpeculativeSettings
    speculative_prompt: SpeculativePrompt
    tenant: str
    cache_salt: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., policy: _Optional[_Union[_common_pb2.CachePolicy, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., max_new_tokens: _Optional[int] = ..., blob_key: _Optional[str] = ..., prefix_tokens: _Optional[int] = ..., speculative: _Optional[_Union[_common_pb2.SpeculativeSettings, _Mapping]] = ..., speculative_prompt: _Optional[_Union[SpeculativePrompt, _Mapping]] = ..., tenant: _Optional[str] = ..., cache_salt: _Optional[str] = ...) -> None: ...

class SpeculativePrompt(_message.Message):
    __slots__ = ("text", "keep_from_char", "pieces")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    KEEP_FROM_CHAR_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    text: str
    keep_from_char: int
    pieces: _containers.RepeatedCompositeFieldContainer[SpeculativePiece]
    def __init__(self, text: _Optional[str] = ..., keep_from_char: _Optional[int] = ..., pieces: _Optional[_Iterable[_Union[SpeculativePiece, _Mapping]]] = ...) -> None: ...

class SpeculativePiece(_message.Message):
    __slots__ = ("role", "content", "offset")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    offset: int
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("blob_key", "blob_size", "first_token_id", "prompt_tokens", "prefill_time", "compress_time", "store_time", "cache_slots", "prefix_cache", "speculative", "prefix_cache_reason")
    BLOB_KEY_FIELD_NUMBER: _ClassVar[int]
    BLOB_SIZE_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TIME_FIELD_NUMBER: _ClassVar[int]
    COMPRESS_TIME_FIELD_NUMBER: _ClassVar[int]
    STORE_TIME_FIELD_NUMBER: _ClassVar[int]
    CACHE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_REASON_FIELD_NUMBER: _ClassVar[int]
    blob_key: str
    blob_size: int
    first_token_id: int
    prompt_tokens: int
    prefill_time: _duration_pb2.Duration
    compress_time: _duration_pb2.Duration
    store_time: _duration_pb2.Duration
    cache_slots: int
    prefix_cache: _common_pb2.PrefixCache
    speculative: _common_pb2.SpeculativeReport
    prefix_cache_reason: str
    def __init__(self, blob_key: _Optional[str] = ..., blob_size: _Optional[int] = ..., first_token_id: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., prefill_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., compress_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., store_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., cache_slots: _Optional[int] = ..., prefix_cache: _Optional[_Union[_common_pb2.PrefixCache, str]] = ..., speculative: _Optional[_Union[_common_pb2.SpeculativeReport, _Mapping]] = ..., prefix_cache_reason: _Optional[str] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("blob_key",)
    BLOB_KEY_FIELD_NUMBER: _ClassVar[int]
    blob_key: str
    def __init__(self, blob_key: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
