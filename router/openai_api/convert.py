"""OpenAI request bodies -> the native ``GenerateRequest``: the one place where the HTTP API
meets protobuf. The router then resolves it as it resolves a gRPC request, so both APIs share
one validator, one set of defaults and one set of error messages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from router.openai_api.schemas import (
    ChatCompletionBody,
    ChatMessageBody,
    CompletionBody,
    GenerationBody,
    SnapstreamOptions,
    SpeculativeOptions,
)
from serving.convert import KIND_TO_PB, OBSERVE_TO_PB, POOLING_TO_PB, UNIT_TO_PB
from serving.errors import RequestError
from serving.speculative import POSITIONS_TO_PB
from snapstream.policy import SIZE_FIELDS
from snapstream.v1 import common_pb2, generation_pb2

# field -> is its value the no-op one (what a client sends when it means "not used")
UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "n": lambda v: v in (None, 1),
    "logprobs": lambda v: v in (None, False, 0),
    "top_logprobs": lambda v: v in (None, 0),
    "logit_bias": lambda v: not v,
    "presence_penalty": lambda v: v in (None, 0),
    "frequency_penalty": lambda v: v in (None, 0),
    "tools": lambda v: not v,
    "tool_choice": lambda v: v in (None, "none"),
    "functions": lambda v: not v,
    "function_call": lambda v: v in (None, "none"),
    "response_format": lambda v: v in (None, {"type": "text"}),
    "best_of": lambda v: v in (None, 1),
    "echo": lambda v: v in (None, False),
    "suffix": lambda v: not v,
}
ROLE_ALIASES = {"developer": "system"}  # OpenAI's newer name for the system message


def chat_request(body: ChatCompletionBody) -> generation_pb2.GenerateRequest:
    request = _common(body)
    request.messages.messages.extend(_message(m) for m in body.messages)
    request.cache_prefix = body.options.cache_prefix or ""
    request.cache_salt = body.options.cache_salt or ""
    if body.options.cache_prefix_chars is not None:
        raise RequestError("snapstream.cache_prefix_chars applies to completions; a chat "
                           "request marks its document with cache_prefix",
                           field="snapstream.cache_prefix_chars")
    return request


def completion_request(body: CompletionBody) -> generation_pb2.GenerateRequest:
    request = _common(body)
    prompt = body.prompt
    if isinstance(prompt, str):
        request.prompt = prompt
    elif prompt and all(isinstance(p, int) for p in prompt):
        request.prompt_token_ids.ids.extend(prompt)
    elif len(prompt) == 1:
        request.prompt = prompt[0]
    else:
        raise RequestError("prompt: give one prompt (a string or a list of token "
                           f"ids); got a list of {len(prompt)}", field="prompt")
    request.cache_prefix_chars = body.options.cache_prefix_chars or 0
    request.cache_salt = body.options.cache_salt or ""
    if body.options.cache_prefix is not None:
        raise RequestError("snapstream.cache_prefix applies to chat completions; a "
                           "completion marks its document with cache_prefix_chars",
                           field="snapstream.cache_prefix")
    return request


def _common(body: GenerationBody) -> generation_pb2.GenerateRequest:
    for name, is_noop in UNSUPPORTED.items():
        if not is_noop(getattr(body, name)):
            raise RequestError(f"{name} is not supported by this server: leave it out"
                               + (" (n must be 1)" if name == "n" else ""), field=name)
    request = generation_pb2.GenerateRequest(sampling=_sampling(body),
                                             policy=_policy(body.options))
    if body.options.speculative is not None:
        request.speculative.CopyFrom(_speculative(body.options.speculative))
    max_new = _max_new_tokens(body)
    if max_new is not None:
        request.max_new_tokens = max_new
    return request


def _max_new_tokens(body: GenerationBody) -> int | None:
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        raise RequestError("give max_completion_tokens or max_tokens, not both",
                           field="max_tokens")
    return body.max_completion_tokens if body.max_tokens is None else body.max_tokens


def _sampling(body: GenerationBody) -> common_pb2.SamplingParams:
    stop = [body.stop] if isinstance(body.stop, str) else body.stop or []
    sampling = common_pb2.SamplingParams(stop=stop)
    for name in ("temperature", "top_p", "top_k", "seed"):
        if getattr(body, name) is not None:
            setattr(sampling, name, getattr(body, name))
    return sampling


def _policy(options: SnapstreamOptions) -> common_pb2.CachePolicy:
    policy = common_pb2.CachePolicy(
        kind=KIND_TO_PB[options.policy] if options.policy else 0,
        pooling=POOLING_TO_PB[options.pooling] if options.pooling else 0,
        observe=OBSERVE_TO_PB[options.observe] if options.observe else 0,
        unit=UNIT_TO_PB[options.unit] if options.unit else 0)
    for name in SIZE_FIELDS:
        if getattr(options, name) is not None:
            setattr(policy, name, getattr(options, name))
    return policy


def _speculative(options: SpeculativeOptions) -> common_pb2.SpeculativeSettings:
    if options.keep is not None and options.keep_tokens is not None:
        raise RequestError("snapstream.speculative: give keep or keep_tokens, not both",
                           field="snapstream.speculative")
    if options.keep is not None and not 0 < options.keep <= 1:  # before float32 rounds it
        raise RequestError(f"snapstream.speculative.keep must be in (0, 1], got {options.keep}",
                           field="snapstream.speculative.keep")
    msg = common_pb2.SpeculativeSettings(
        positions=POSITIONS_TO_PB[options.positions] if options.positions else 0)
    for name in ("keep", "keep_tokens", "chunk_size", "look_ahead", "draft_model"):
        if getattr(options, name) is not None:
            setattr(msg, name, getattr(options, name))
    return msg


def _message(message: ChatMessageBody) -> generation_pb2.ChatMessage:
    content = message.content
    if not isinstance(content, str):
        content = "".join(part.text for part in content)
    return generation_pb2.ChatMessage(role=ROLE_ALIASES.get(message.role, message.role),
                                      content=content)
