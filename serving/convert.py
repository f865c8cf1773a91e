"""Protobuf <-> domain types. The proto stops here: services work with CachePolicy and
SamplingParams, never with messages."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from serving.errors import RequestError
from snapstream.policy import SIZE_FIELDS, CachePolicy, resolve_policy
from snapstream.sampling_params import SamplingParams
from snapstream.v1 import common_pb2

KIND_TO_PB = {"full": common_pb2.POLICY_KIND_FULL, "streaming": common_pb2.POLICY_KIND_STREAMING,
              "snapkv": common_pb2.POLICY_KIND_SNAPKV,
              "snapstream": common_pb2.POLICY_KIND_SNAPSTREAM}
KIND_FROM_PB = {v: k for k, v in KIND_TO_PB.items()}
POOLING_TO_PB = {"avg": common_pb2.POOLING_AVG, "max": common_pb2.POOLING_MAX}
POOLING_FROM_PB = {v: k for k, v in POOLING_TO_PB.items()}
OBSERVE_TO_PB = {"last": common_pb2.OBSERVE_LAST, "opening": common_pb2.OBSERVE_OPENING}
OBSERVE_FROM_PB = {v: k for k, v in OBSERVE_TO_PB.items()}
UNIT_TO_PB = {"token": common_pb2.UNIT_TOKEN, "word": common_pb2.UNIT_WORD}
UNIT_FROM_PB = {v: k for k, v in UNIT_TO_PB.items()}
# the enum fields of a CachePolicy message: field -> (its values, pb -> domain)
ENUM_FIELDS = {"kind": KIND_FROM_PB, "pooling": POOLING_FROM_PB, "observe": OBSERVE_FROM_PB,
               "unit": UNIT_FROM_PB}
FINISH_TO_PB = {"length": common_pb2.FINISH_REASON_LENGTH,
                "stop_token": common_pb2.FINISH_REASON_STOP_TOKEN,
                "stop_string": common_pb2.FINISH_REASON_STOP_STRING,
                "context_length": common_pb2.FINISH_REASON_CONTEXT_LENGTH}
FINISH_FROM_PB = {v: k for k, v in FINISH_TO_PB.items()}
# what happened to a request's reusable document; "" when it marked none
PREFIX_CACHE_TO_PB = {"": common_pb2.PREFIX_CACHE_UNSPECIFIED,
                      "stored": common_pb2.PREFIX_CACHE_STORED,
                      "hit": common_pb2.PREFIX_CACHE_HIT, "bypass": common_pb2.PREFIX_CACHE_BYPASS}
PREFIX_CACHE_FROM_PB = {v: k for k, v in PREFIX_CACHE_TO_PB.items()}


def policy_from_pb(msg: common_pb2.CachePolicy, default: CachePolicy) -> CachePolicy:
    """Unset fields take ``default``'s (:func:`~snapstream.policy.resolve_policy`); raises
    RequestError naming a bad field."""
    given = {name: getattr(msg, name) for name in SIZE_FIELDS if msg.HasField(name)}
    for name, from_pb in ENUM_FIELDS.items():
        value = getattr(msg, name)
        if value in from_pb:
            given[name] = from_pb[value]
        elif value != 0:  # 0: unspecified in every enum
            raise RequestError(f"policy.{name}: unknown value {value}", field=f"policy.{name}")
    try:
        return resolve_policy(default, given)
    except ValueError as exc:
        raise RequestError(f"policy: {exc}", field="policy") from None


def policy_to_pb(policy: CachePolicy) -> common_pb2.CachePolicy:
    return common_pb2.CachePolicy(kind=KIND_TO_PB[policy.kind], pooling=POOLING_TO_PB[
        policy.pooling], observe=OBSERVE_TO_PB[policy.observe], unit=UNIT_TO_PB[policy.unit],
        **{name: getattr(policy, name) for name in SIZE_FIELDS})


def sampling_from_pb(msg: common_pb2.SamplingParams, default: SamplingParams) -> SamplingParams:
    """Unset fields take ``default``'s; raises RequestError naming a bad field."""
    try:
        return SamplingParams(
            temperature=msg.temperature if msg.HasField("temperature") else default.temperature,
            top_k=msg.top_k if msg.HasField("top_k") else default.top_k,
            top_p=msg.top_p if msg.HasField("top_p") else default.top_p,
            seed=msg.seed if msg.HasField("seed") else default.seed,
            stop_token_ids=tuple(msg.stop_token_ids) or default.stop_token_ids)
    except ValueError as exc:
        raise RequestError(f"sampling: {exc}", field="sampling") from None


def sampling_to_pb(params: SamplingParams, stop: tuple[str, ...] = ()) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(temperature=params.temperature, top_k=params.top_k,
                                    top_p=params.top_p, stop=list(stop),
                                    stop_token_ids=list(params.stop_token_ids))
    if params.seed is not None:
        msg.seed = params.seed
    return msg


def duration(seconds: float) -> Duration:
    msg = Duration()
    msg.FromNanoseconds(int(seconds * 1e9))
    return msg
