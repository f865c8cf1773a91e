"""GenerateRequest -> ResolvedRequest: every field checked, every default applied.

Raises RequestError whose message names the field and says what to change (INVALID_ARGUMENT).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from pathlib import Path

from serving.convert import policy_from_pb, sampling_from_pb
from serving.errors import RequestError
from serving.speculative import speculative_from_pb
from snapstream.chat import ChatMessage, TemplateError
from snapstream.config import ModelConfig
from snapstream.policy import CachePolicy
from snapstream.sampling_params import SamplingParams
from snapstream.specprefill.pieces import Request, render_served
from snapstream.specprefill.settings import SpeculativeSettings
from snapstream.tokenizer import Tokenizer
from snapstream.v1 import common_pb2, generation_pb2, prefill_pb2

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_CACHE_SALT_LENGTH = 256


@dataclass(frozen=True)
class RequestLimits:
    """The most a request may ask of each per-request knob that costs compute (router flags);
    past one, the request is refused before any work, naming the limit."""

    max_new_tokens: int = 4096  # --limit-max-new-tokens (the context bounds it too)
    look_ahead: int = 32  # --limit-look-ahead: tokens the draft decodes, one step each
    chunk_size: int = 512  # --limit-chunk-size: the draft's selection unit, in its tokens

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "look_ahead", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--limit-{name.replace('_', '-')} must be >= 1, "
                                 f"got {getattr(self, name)}")


@dataclass(frozen=True)
class ServedModel:
    name: str
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    default_policy: CachePolicy
    default_max_new_tokens: int
    limits: RequestLimits = RequestLimits()

    @property
    def context_len(self) -> int:
        return self.config.max_position_embeddings


@dataclass(frozen=True)
class ResolvedRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams  # stop_token_ids include the model's end-of-sequence tokens
    stop: tuple[str, ...]
    policy: CachePolicy
    prefix_tokens: int = 0  # the first ones are a reusable document (cache_prefix*)
    tenant: str = ""  # whose request (the API key's tenant); its document cache's namespace
    cache_salt: str = ""  # a finer namespace inside the tenant's (GenerateRequest.cache_salt)
    # speculative prefill: the settings as the client sent them (validated; the prefill
    # worker fills in its defaults) and the prompt's text for the draft; None: not asked
    speculative: common_pb2.SpeculativeSettings | None = None
    speculative_prompt: prefill_pb2.SpeculativePrompt | None = None


def resolve(request: generation_pb2.GenerateRequest, model: ServedModel,
            request_id: str, tenant: str) -> ResolvedRequest:
    speculative_prompt, is_compact = _speculative(request, model)
    ids, prefix_tokens = _prompt_ids(request, model, check_context=not is_compact)
    if prefix_tokens and speculative_prompt:
        raise RequestError("cache_prefix and speculative cannot be combined: a reusable "
                           "document is prefilled whole; send one of them", field="speculative")
    max_new = request.max_new_tokens if request.HasField("max_new_tokens") else (
        model.default_max_new_tokens)
    if not 1 <= max_new <= model.context_len:
        raise RequestError(f"max_new_tokens must be in [1, {model.context_len}], got {max_new}",
                           field="max_new_tokens")
    if max_new > model.limits.max_new_tokens:
        raise RequestError(f"max_new_tokens {max_new} exceeds this server's limit of "
                           f"{model.limits.max_new_tokens} (--limit-max-new-tokens)",
                           field="max_new_tokens")
    if len(request.cache_salt) > MAX_CACHE_SALT_LENGTH:
        raise RequestError(f"cache_salt has {len(request.cache_salt)} characters; at most "
                           f"{MAX_CACHE_SALT_LENGTH}", field="cache_salt")
    policy = policy_from_pb(request.policy, model.default_policy)
    try:
        policy.check_context(model.context_len)
    except ValueError as exc:
        raise RequestError(f"policy: {exc}", field="policy") from None
    if prefix_tokens and not policy.spec.is_sized:
        raise RequestError(f"cache_prefix needs a policy that bounds the cache (snapstream, "
                           f"snapkv, streaming), not {policy.kind!r}", field="policy")
    if not (policy.is_fixed_size or is_compact) and len(ids) + max_new > model.context_len:
        raise RequestError(
            f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new}) exceeds the context of "
            f"{model.context_len} for the growing policy {policy.kind!r}: lower max_new_tokens "
            "or use a fixed-size policy (snapstream, streaming)", field="max_new_tokens")
    return ResolvedRequest(request_id=request_id, prompt_ids=tuple(ids),
                           max_new_tokens=max_new, sampling=_sampling(request, model),
                           stop=_stop_strings(request), policy=policy,
                           prefix_tokens=prefix_tokens, tenant=tenant,
                           cache_salt=request.cache_salt,
                           speculative=request.speculative if speculative_prompt else None,
                           speculative_prompt=speculative_prompt)


def _speculative(request: generation_pb2.GenerateRequest, model: ServedModel
                 ) -> tuple[prefill_pb2.SpeculativePrompt | None, bool]:
    """The text the draft reads (None: not asked) and whether positions are compact (then the
    prompt may be longer than the target's context: the prefill worker checks what it keeps)."""
    if not request.HasField("speculative"):
        return None, False
    settings = speculative_from_pb(request.speculative,
                                   SpeculativeSettings.defaults_for(model.config))
    _check_limits(settings, model.limits)
    which = request.WhichOneof("input")
    if which == "prompt":
        return prefill_pb2.SpeculativePrompt(text=request.prompt), settings.positions == "compact"
    if which != "messages":
        raise RequestError("speculative: send prompt or messages, not prompt_token_ids (the "
                           "draft model reads the text)", field="speculative")
    chat = _chat_messages(request.messages)
    try:
        view = render_served(model.tokenizer, Request(tuple(chat), is_chat=True))
    except ValueError as exc:  # the template rewrites a message's content
        raise RequestError(f"speculative: {exc}", field="speculative") from None
    prompt = prefill_pb2.SpeculativePrompt(text=view.text, pieces=[
        prefill_pb2.SpeculativePiece(
            role=message.role, offset=piece.text_start,
            content=view.text[piece.text_start:piece.text_start + piece.length])
        for message, piece in zip(chat, view.pieces, strict=True)])
    users = [p for m, p in zip(chat, view.pieces, strict=True) if m.role == "user" and p.length]
    if users:
        prompt.keep_from_char = users[-1].text_start
    return prompt, settings.positions == "compact"


def _check_limits(settings: SpeculativeSettings, limits: RequestLimits) -> None:
    """The draft's work: ``look_ahead`` decode steps and chunks of ``chunk_size``."""
    for name in ("look_ahead", "chunk_size"):
        value, limit = getattr(settings, name), getattr(limits, name)
        if value > limit:
            raise RequestError(f"speculative.{name} {value} exceeds this server's limit of "
                               f"{limit} (--limit-{name.replace('_', '-')})",
                               field=f"speculative.{name}")


def _prompt_ids(request: generation_pb2.GenerateRequest, model: ServedModel,
                check_context: bool = True) -> tuple[list[int], int]:
    """The prompt's ids and how many of the first are its reusable document (0: none)."""
    which = request.WhichOneof("input")
    if which is None:
        raise RequestError("input: set prompt, prompt_token_ids or messages", field="input")
    _check_prefix_fields(request, which)
    prefix_tokens = 0
    if which == "prompt":
        if not request.prompt:
            raise RequestError("prompt is empty: give some text", field="prompt")
        ids, prefix_tokens = _text_ids(request, model)
    elif which == "messages":
        ids, prefix_tokens = _chat_ids(request, model)
    else:
        ids = list(request.prompt_token_ids.ids)
        if not ids:
            raise RequestError("prompt_token_ids is empty: give at least one token id",
                               field="prompt_token_ids")
        bad = [i for i in ids if i >= model.config.vocab_size]
        if bad:
            raise RequestError(f"prompt_token_ids {bad[:5]} are outside the vocabulary "
                               f"[0, {model.config.vocab_size})", field="prompt_token_ids")
    if prefix_tokens > model.context_len:
        field = "cache_prefix" if which == "messages" else "cache_prefix_chars"
        raise RequestError(f"{field} marks a document of {prefix_tokens} tokens; the model's "
                           f"context is {model.context_len}: shorten it", field=field)
    if check_context and len(ids) > model.context_len:
        raise RequestError(f"{which} has {len(ids)} tokens; the model's context is "
                           f"{model.context_len}: shorten it", field=which)
    return ids, prefix_tokens


def _check_prefix_fields(request: generation_pb2.GenerateRequest, which: str) -> None:
    if request.cache_prefix and which != "messages":
        raise RequestError("cache_prefix applies to messages; for a text prompt give "
                           "cache_prefix_chars", field="cache_prefix")
    if request.cache_prefix_chars and which != "prompt":
        raise RequestError("cache_prefix_chars applies to a text prompt; for messages give "
                           "cache_prefix", field="cache_prefix_chars")


def _text_ids(request: generation_pb2.GenerateRequest, model: ServedModel
              ) -> tuple[list[int], int]:
    num_chars = request.cache_prefix_chars
    if not num_chars:
        return model.tokenizer.encode(request.prompt), 0
    if num_chars >= len(request.prompt):
        raise RequestError(f"cache_prefix_chars ({num_chars}) must be less than the prompt's "
                           f"{len(request.prompt)} characters: the question follows the "
                           "document", field="cache_prefix_chars")
    return model.tokenizer.encode_prefixed(request.prompt[:num_chars],
                                           request.prompt[num_chars:])


# cache_prefix -> how many leading messages form the document
PREFIX_MESSAGES = {
    "system": lambda chat: 1 if chat[0].role == "system" else None,
    "first_user": lambda chat: next((i + 1 for i, m in enumerate(chat) if m.role == "user"),
                                    None),
}


def _chat_ids(request: generation_pb2.GenerateRequest, model: ServedModel
              ) -> tuple[list[int], int]:
    chat = _chat_messages(request.messages)
    try:
        if not request.cache_prefix:
            return model.tokenizer.encode(model.tokenizer.render_chat(chat)), 0
        if request.cache_prefix not in PREFIX_MESSAGES:
            raise RequestError(f"cache_prefix must be one of {', '.join(PREFIX_MESSAGES)}, "
                               f"got {request.cache_prefix!r}", field="cache_prefix")
        count = PREFIX_MESSAGES[request.cache_prefix](chat)
        if count is None:
            raise RequestError(f"cache_prefix {request.cache_prefix!r}: the messages have no "
                               f"{request.cache_prefix.replace('_', ' ')} message to cache",
                               field="cache_prefix")
        head, rest = model.tokenizer.render_chat_split(chat, count)
    except TemplateError as exc:  # the model's template refuses the conversation
        raise RequestError(f"messages: {exc}", field="messages") from None
    return model.tokenizer.encode_prefixed(head, rest)


def _chat_messages(messages: generation_pb2.ChatMessages) -> list[ChatMessage]:
    if not messages.messages:
        raise RequestError("messages is empty: give at least one message", field="messages")
    chat = []
    for i, message in enumerate(messages.messages):
        try:
            chat.append(ChatMessage(message.role, message.content))
        except ValueError as exc:
            raise RequestError(f"messages[{i}].{exc}", field=f"messages[{i}]") from None
    return chat


def _sampling(request: generation_pb2.GenerateRequest, model: ServedModel) -> SamplingParams:
    sampling = sampling_from_pb(request.sampling, SamplingParams())
    bad = [i for i in sampling.stop_token_ids if i >= model.config.vocab_size]
    if bad:
        raise RequestError(f"sampling.stop_token_ids {bad[:5]} are outside the vocabulary",
                           field="sampling.stop_token_ids")
    stop_ids = tuple(dict.fromkeys((*sampling.stop_token_ids, *model.tokenizer.eos_token_ids)))
    seed = sampling.seed
    if seed is None and not sampling.is_greedy:
        seed = secrets.randbits(62)  # fixed per request, so a resumed stream samples the same
    return replace(sampling, stop_token_ids=stop_ids, seed=seed)


def _stop_strings(request: generation_pb2.GenerateRequest) -> tuple[str, ...]:
    stop = tuple(request.sampling.stop)
    if len(stop) > MAX_STOP_STRINGS:
        raise RequestError(f"sampling.stop has {len(stop)} strings; at most "
                           f"{MAX_STOP_STRINGS}", field="sampling.stop")
    if any(not s or len(s) > MAX_STOP_LENGTH for s in stop):
        raise RequestError(f"sampling.stop strings must be 1..{MAX_STOP_LENGTH} characters",
                           field="sampling.stop")
    return stop
