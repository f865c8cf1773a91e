import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PolicyKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_KIND_UNSPECIFIED: _ClassVar[PolicyKind]
    POLICY_KIND_FULL: _ClassVar[PolicyKind]
    POLICY_KIND_STREAMING: _ClassVar[PolicyKind]
    POLICY_KIND_SNAPKV: _ClassVar[PolicyKind]
    POLICY_KIND_SNAPSTREAM: _ClassVar[PolicyKind]

class Pooling(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POOLING_UNSPECIFIED: _ClassVar[Pooling]
    POOLING_AVG: _ClassVar[Pooling]
    POOLING_MAX: _ClassVar[Pooling]

class Observe(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBSERVE_UNSPECIFIED: _ClassVar[Observe]
    OBSERVE_LAST: _ClassVar[Observe]
    OBSERVE_OPENING: _ClassVar[Observe]

class Unit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNIT_UNSPECIFIED: _ClassVar[Unit]
    UNIT_TOKEN: _ClassVar[Unit]
    UNIT_WORD: _ClassVar[Unit]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP_TOKEN: _ClassVar[FinishReason]
    FINISH_REASON_STOP_STRING: _ClassVar[FinishReason]
    FINISH_REASON_CONTEXT_LENGTH: _ClassVar[FinishReason]

class PrefixCache(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREFIX_CACHE_UNSPECIFIED: _ClassVar[PrefixCache]
    PREFIX_CACHE_STORED: _ClassVar[PrefixCache]
    PREFIX_CACHE_HIT: _ClassVar[PrefixCache]
    PREFIX_CACHE_BYPASS: _ClassVar[PrefixCache]

class PositionMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POSITION_MODE_UNSPECIFIED: _ClassVar[PositionMode]
    POSITION_MODE_ORIGINAL: _ClassVar[PositionMode]
    POSITION_MODE_COMPACT: _ClassVar[PositionMode]
POLICY_KIND_UNSPECIFIED: PolicyKind
POLICY_KIND_FULL: PolicyKind
POLICY_KIND_STREAMING: PolicyKind
POLICY_KIND_SNAPKV: PolicyKind
POLICY_KIND_SNAPSTREAM: PolicyKind
POOLING_UNSPECIFIED: Pooling
POOLING_AVG: Pooling
POOLING_MAX: Pooling
OBSERVE_UNSPECIFIED: Observe
OBSERVE_LAST: Observe
OBSERVE_OPENING: Observe
UNIT_UNSPECIFIED: Unit
UNIT_TOKEN: Unit
UNIT_WORD: Unit
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP_TOKEN: FinishReason
FINISH_REASON_STOP_STRING: FinishReason
FINISH_REASON_CONTEXT_LENGTH: FinishReason
PREFIX_CACHE_UNSPECIFIED: PrefixCache
PREFIX_CACHE_STORED: PrefixCache
PREFIX_CACHE_HIT: PrefixCache
PREFIX_CACHE_BYPASS: PrefixCache
POSITION_MODE_UNSPECIFIED: PositionMode
POSITION_MODE_ORIGINAL: PositionMode
POSITION_MODE_COMPACT: PositionMode

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "stop", "stop_token_ids")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CachePolicy(_message.Message):
    __slots__ = ("kind", "n_sink", "n_topk", "n_recent", "observation", "kernel", "pooling", "observe", "unit")
    KIND_FIELD_NUMBER: _ClassVar[int]
    N_SINK_FIELD_NUMBER: _ClassVar[int]
    N_TOPK_FIELD_NUMBER: _ClassVar[int]
    N_RECENT_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    OBSERVE_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    kind: PolicyKind
    n_sink: int
    n_topk: int
    n_recent: int
    observation: int
    kernel: int
    pooling: Pooling
    observe: Observe
    unit: Unit
    def __init__(self, kind: _Optional[_Union[PolicyKind, str]] = ..., n_sink: _Optional[int] = ..., n_topk: _Optional[int] = ..., n_recent: _Optional[int] = ..., observation: _Optional[int] = ..., kernel: _Optional[int] = ..., pooling: _Optional[_Union[Pooling, str]] = ..., observe: _Optional[_Union[Observe, str]] = ..., unit: _Optional[_Union[Unit, str]] = ...) -> None: ...

class SpeculativeSettings(_message.Message):
    __slots__ = ("keep", "keep_tokens", "chunk_size", "look_ahead", "positions", "draft_model")
    KEEP_FIELD_NUMBER: _ClassVar[int]
    KEEP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOOK_AHEAD_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_FIELD_NUMBER: _ClassVar[int]
    keep: float
    keep_tokens: int
    chunk_size: int
    look_ahead: int
    positions: PositionMode
    draft_model: str
    def __init__(self, keep: _Optional[float] = ..., keep_tokens: _Optional[int] = ..., chunk_size: _Optional[int] = ..., look_ahead: _Optional[int] = ..., positions: _Optional[_Union[PositionMode, str]] = ..., draft_model: _Optional[str] = ...) -> None: ...

class SpeculativeReport(_message.Message):
    __slots__ = ("draft_time", "target_prefill_time", "kept_tokens", "prompt_tokens", "skipped", "positions")
    DRAFT_TIME_FIELD_NUMBER: _ClassVar[int]
    TARGET_PREFILL_TIME_FIELD_NUMBER: _ClassVar[int]
    KEPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    draft_time: _duration_pb2.Duration
    target_prefill_time: _duration_pb2.Duration
    kept_tokens: int
    prompt_tokens: int
    skipped: str
    positions: PositionMode
    def __init__(self, draft_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., target_prefill_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., kept_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., skipped: _Optional[str] = ..., positions: _Optional[_Union[PositionMode, str]] = ...) -> None: ...
