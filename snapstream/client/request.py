"""Building a ``GenerateRequest`` from keyword options; an option left out or None stays unset
in the message, so the server's default applies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict, Unpack

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from google.protobuf.message import Message

from snapstream.client.errors import InvalidArgument
from snapstream.policy import SIZE_FIELDS
from snapstream.v1 import common_pb2, generation_pb2

Prompt = str | Sequence[int]
Messages = Sequence[Mapping[str, str]]  # [{"role": "user", "content": "..."}, ...]


class GenerateOptions(TypedDict, total=False):
    """Options of one generation (all optional; None means the server's default).

    ``stop`` is a stop string or a sequence of them, matched on the generated text;
    ``policy`` is a cache policy kind (full, streaming, snapkv, snapstream), ``pooling`` a
    SnapKV pooling (avg, max) and ``observe`` whose queries its window holds (last, or opening:
    also the last turn's opening read again after the prompt, for a question placed before its
    document) and ``unit`` what it keeps whole (token, or word: a number or identifier's
    tokens together); the sizes are tokens per layer and KV head.
    ``cache_prefix`` ("system" or "first_user", for chat) and ``cache_prefix_chars`` (for a text
    prompt) mark a reusable document at the start of the prompt: compressed once, stored, and
    reused by the next requests that start with it (``Completion.prefix_cache`` says which).
    ``speculative`` asks for speculative prefill (a prefill worker with --draft-model): a mapping
    of :data:`SPECULATIVE_KEYS` (``{}``: the worker's defaults), e.g. ``{"keep": 0.25}``.
    """

    max_new_tokens: int | None
    temperature: float | None
    top_k: int | None
    top_p: float | None
    seed: int | None
    stop: str | Sequence[str]
    stop_token_ids: Sequence[int]
    policy: str | None
    n_sink: int | None
    n_topk: int | None
    n_recent: int | None
    observation: int | None
    kernel: int | None
    pooling: str | None
    observe: str | None
    unit: str | None
    cache_prefix: str | None
    cache_prefix_chars: int | None
    speculative: Mapping[str, float | int | str] | None


# keep (a share in (0, 1]) or keep_tokens; chunk_size, look_ahead (tokens); positions
# (original, compact); draft_model ("auto": the prefill worker's draft, or that draft's name)
SPECULATIVE_KEYS = ("keep", "keep_tokens", "chunk_size", "look_ahead", "positions",
                    "draft_model")


_SAMPLING_SCALARS = ("temperature", "top_k", "top_p", "seed")


def build_request(prompt: Prompt,
                  **options: Unpack[GenerateOptions]) -> generation_pb2.GenerateRequest:
    """Raises TypeError for an unknown option and InvalidArgument for a value the message
    cannot hold (a negative size, an unknown policy name)."""
    request = generation_pb2.GenerateRequest()
    _set_prompt(request, prompt)
    _set_options(request, options)
    return request


def build_chat_request(messages: Messages,
                       **options: Unpack[GenerateOptions]) -> generation_pb2.GenerateRequest:
    """A conversation for the model's chat template; each message has a role and content."""
    request = generation_pb2.GenerateRequest()
    request.messages.SetInParent()  # selects the oneof even for an empty list
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
            raise InvalidArgument(f"messages[{i}] must be a mapping with exactly 'role' and "
                                  f"'content', got {message!r}")
        try:
            request.messages.messages.add(role=message["role"], content=message["content"])
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"messages[{i}]: {exc}") from None
    _set_options(request, options)
    return request


def _set_options(request: generation_pb2.GenerateRequest, options: GenerateOptions) -> None:
    unknown = options.keys() - GenerateOptions.__annotations__.keys()
    if unknown:
        raise TypeError(f"unknown generate option(s): {', '.join(sorted(unknown))}")
    _set(request, "max_new_tokens", options.get("max_new_tokens"))
    for name in _SAMPLING_SCALARS:
        _set(request.sampling, name, options.get(name))
    stop = options.get("stop", ())
    _extend(request.sampling.stop, "stop", (stop,) if isinstance(stop, str) else stop)
    _extend(request.sampling.stop_token_ids, "stop_token_ids", options.get("stop_token_ids", ()))
    for name in SIZE_FIELDS:
        _set(request.policy, name, options.get(name))
    request.policy.kind = _enum_value(common_pb2.PolicyKind, "POLICY_KIND_", "policy",
                                      options.get("policy"))
    request.policy.pooling = _enum_value(common_pb2.Pooling, "POOLING_", "pooling",
                                         options.get("pooling"))
    request.policy.observe = _enum_value(common_pb2.Observe, "OBSERVE_", "observe",
                                         options.get("observe"))
    request.policy.unit = _enum_value(common_pb2.Unit, "UNIT_", "unit", options.get("unit"))
    _set(request, "cache_prefix", options.get("cache_prefix"))
    _set(request, "cache_prefix_chars", options.get("cache_prefix_chars"))
    speculative = options.get("speculative")
    if speculative is not None:
        _set_speculative(request.speculative, speculative)


def _set_speculative(message: common_pb2.SpeculativeSettings,
                     given: Mapping[str, float | int | str]) -> None:
    message.SetInParent()  # asked for, even with every setting left to the worker
    unknown = set(given) - set(SPECULATIVE_KEYS)
    if unknown:
        raise InvalidArgument(f"speculative: unknown key(s) {', '.join(sorted(unknown))} "
                              f"(use {', '.join(SPECULATIVE_KEYS)})")
    for name in ("keep", "keep_tokens", "chunk_size", "look_ahead", "draft_model"):
        _set(message, name, given.get(name))
    message.positions = _enum_value(common_pb2.PositionMode, "POSITION_MODE_",
                                    "speculative.positions", given.get("positions"))


def enum_names(enum: EnumTypeWrapper, prefix: str) -> dict[str, int]:
    """``{"snapstream": POLICY_KIND_SNAPSTREAM, ...}``: the lower-case names of a proto enum,
    without its prefix and its UNSPECIFIED zero value."""
    return {name.removeprefix(prefix).lower(): value for name, value in enum.items() if value}


def _enum_value(enum: EnumTypeWrapper, prefix: str, field: str, name: str | None) -> int:
    if name is None:
        return 0  # *_UNSPECIFIED: the server's default
    values = enum_names(enum, prefix)
    if name not in values:
        raise InvalidArgument(f"{field} must be one of {', '.join(values)}, got {name!r}")
    return values[name]


def _set_prompt(request: generation_pb2.GenerateRequest, prompt: Prompt) -> None:
    if isinstance(prompt, str):
        request.prompt = prompt
        return
    request.prompt_token_ids.SetInParent()  # selects the oneof even for an empty list
    _extend(request.prompt_token_ids.ids, "prompt", prompt)


def _set(message: Message, field: str, value: float | None) -> None:
    if value is None:
        return
    try:
        setattr(message, field, value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{field}={value!r} cannot be sent: {exc}") from None


def _extend(repeated, field: str, values: Sequence) -> None:
    try:
        repeated.extend(values)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{field}: {exc}") from None


def call_timeout(timeout_s: float | None, default_s: float | None) -> float | None:
    """The deadline of one call in seconds from now: ``timeout_s``, else the client's default;
    None waits forever."""
    timeout_s = default_s if timeout_s is None else timeout_s
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds or None, got {timeout_s}")
    return timeout_s
