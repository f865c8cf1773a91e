import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from snapstream.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "prompt_token_ids", "messages", "max_new_tokens", "sampling", "policy", "cache_prefix", "cache_prefix_chars", "speculative", "cache_salt")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CACHE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    CACHE_PREFIX_CHARS_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    prompt_token_ids: _common_pb2.TokenIds
    messages: ChatMessages
    max_new_tokens: int
    sampling: _common_pb2.SamplingParams
    policy: _common_pb2.CachePolicy
    cache_prefix: str
    cache_prefix_chars: int
    speculative: _common_pb2.SpeculativeSettings
    cache_salt: str
    def __init__(self, prompt: _Optional[str] = ..., prompt_token_ids: _Optional[_Union[_common_pb2.TokenIds, _Mapping]] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., max_new_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., policy: _Optional[_Union[_common_pb2.CachePolicy, _Mapping]] = ..., cache_prefix: _Optional[str] = ..., cache_prefix_chars: _Optional[int] = ..., speculative: _Optional[_Union[_common_pb2.SpeculativeSettings, _Mapping]] = ..., cache_salt: _Optional[str] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("chunk", "complete")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    chunk: GenerateChunk
    complete: GenerateComplete
    def __init__(self, chunk: _Optional[_Union[GenerateChunk, _Mapping]] = ..., complete: _Optional[_Union[GenerateComplete, _Mapping]] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("token_ids", "text")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ...) -> None: ...

class GenerateComplete(_message.Message):
    __slots__ = ("finish_reason", "prompt_tokens", "completion_tokens", "time_to_first_token", "decode_time", "simulated_decode_time", "kv_cache_bytes", "kv_cache_slots", "prefix_cache", "speculative", "prefix_cache_reason")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DECODE_TIME_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_DECODE_TIME_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_REASON_FIELD_NUMBER: _ClassVar[int]
    finish_reason: _common_pb2.FinishReason
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token: _duration_pb2.Duration
    decode_time: _duration_pb2.Duration
    simulated_decode_time: _duration_pb2.Duration
    kv_cache_bytes: int
    kv_cache_slots: int
    prefix_cache: _common_pb2.PrefixCache
    speculative: _common_pb2.SpeculativeReport
    prefix_cache_reason: str
    def __init__(self, finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., time_to_first_token: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., decode_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., simulated_decode_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., kv_cache_bytes: _Optional[int] = ..., kv_cache_slots: _Optional[int] = ..., prefix_cache: _Optional[_Union[_common_pb2.PrefixCache, str]] = ..., speculative: _Optional[_Union[_common_pb2.SpeculativeReport, _Mapping]] = ..., prefix_cache_reason: _Optional[str] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_name", "model_fingerprint", "context_length", "vocab_size", "eos_token_ids", "default_policy", "has_chat_template")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_POLICY_FIELD_NUMBER: _ClassVar[int]
    HAS_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    model_fingerprint: str
    context_length: int
    vocab_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    default_policy: _common_pb2.CachePolicy
    has_chat_template: bool
    def __init__(self, model_name: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., context_length: _Optional[int] = ..., vocab_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., default_policy: _Optional[_Union[_common_pb2.CachePolicy, _Mapping]] = ..., has_chat_template: _Optional[bool] = ...) -> None: ...
