"""What the client returns: chunks while a generation streams, then a Completion; ModelInfo."""

from __future__ import annotations

from dataclasses import dataclass

from snapstream.client.errors import Internal
from snapstream.client.request import enum_names
from snapstream.policy import CachePolicy
from snapstream.v1 import common_pb2, generation_pb2

_FINISH_REASONS = {value: name for name, value in
                   enum_names(common_pb2.FinishReason, "FINISH_REASON_").items()}
_POLICY_KINDS = {value: name for name, value in
                 enum_names(common_pb2.PolicyKind, "POLICY_KIND_").items()}
_PREFIX_CACHE = {value: name for name, value in
                 enum_names(common_pb2.PrefixCache, "PREFIX_CACHE_").items()}
_POSITION_MODES = {value: name for name, value in
                   enum_names(common_pb2.PositionMode, "POSITION_MODE_").items()}
_POOLINGS = {value: name for name, value in enum_names(common_pb2.Pooling, "POOLING_").items()}
_OBSERVES = {value: name for name, value in enum_names(common_pb2.Observe, "OBSERVE_").items()}
_UNITS = {value: name for name, value in enum_names(common_pb2.Unit, "UNIT_").items()}


@dataclass(frozen=True)
class Chunk:
    """Tokens generated since the previous chunk and their text (never a split character)."""

    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class SpeculativeUsage:
    """What a speculative prefill did (``skipped`` says why a prompt was prefilled whole;
    ``positions``: the position mode that ran, the request's or the worker's default)."""

    draft_time_s: float
    target_prefill_time_s: float
    kept_tokens: int
    prompt_tokens: int
    skipped: str
    positions: str

    @classmethod
    def from_pb(cls, msg: common_pb2.SpeculativeReport) -> SpeculativeUsage:
        return cls(draft_time_s=msg.draft_time.ToNanoseconds() / 1e9,
                   target_prefill_time_s=msg.target_prefill_time.ToNanoseconds() / 1e9,
                   kept_tokens=msg.kept_tokens, prompt_tokens=msg.prompt_tokens,
                   skipped=msg.skipped, positions=_POSITION_MODES[msg.positions])


@dataclass(frozen=True)
class Completion:
    """A finished generation. ``finish_reason``: length, stop_token, stop_string or
    context_length; times are measured by the router."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_s: float
    decode_time_s: float
    kv_cache_bytes: int  # the sequence's KV cache as it traveled from prefill to decode
    kv_cache_slots: int  # its slots per global layer and KV head (sliding layers: their window)
    prefix_cache: str = ""  # stored, hit or bypass when the request marked a document
    speculative: SpeculativeUsage | None = None  # when the request asked for it


@dataclass(frozen=True)
class ModelInfo:
    model_name: str
    model_fingerprint: str
    context_length: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    default_policy: CachePolicy
    has_chat_template: bool

    @classmethod
    def from_pb(cls, msg: generation_pb2.InfoResponse) -> ModelInfo:
        policy = msg.default_policy
        try:
            default_policy = CachePolicy(
                kind=_POLICY_KINDS.get(policy.kind, ""), pooling=_POOLINGS.get(policy.pooling, ""),
                n_sink=policy.n_sink, n_topk=policy.n_topk, n_recent=policy.n_recent,
                observation=policy.observation, kernel=policy.kernel,
                observe=_OBSERVES.get(policy.observe, ""), unit=_UNITS.get(policy.unit, ""))
        except ValueError as exc:
            raise Internal(f"the server's default_policy is not resolved: {exc}") from None
        return cls(model_name=msg.model_name, model_fingerprint=msg.model_fingerprint,
                   context_length=msg.context_length, vocab_size=msg.vocab_size,
                   eos_token_ids=tuple(msg.eos_token_ids), default_policy=default_policy,
                   has_chat_template=msg.has_chat_template)


class CompletionBuilder:
    """Folds the messages of one Generate stream into chunks and, at the end, a Completion.
    Raises Internal when the stream breaks the protocol (data after the final message, or no
    final message)."""

    def __init__(self) -> None:
        self._texts: list[str] = []
        self._token_ids: list[int] = []
        self._completion: Completion | None = None

    def add(self, message: generation_pb2.GenerateResponse) -> Chunk | None:
        """The message's chunk, or None for the final message."""
        if self._completion is not None:
            raise Internal("the server sent a message after GenerateComplete")
        kind = message.WhichOneof("kind")
        if kind == "chunk":
            chunk = Chunk(tuple(message.chunk.token_ids), message.chunk.text)
            self._texts.append(chunk.text)
            self._token_ids.extend(chunk.token_ids)
            return chunk
        if kind == "complete":
            self._completion = self._complete(message.complete)
            return None
        raise Internal(f"the server sent a GenerateResponse without a known kind ({kind})")

    def finish(self) -> Completion:
        if self._completion is None:
            raise Internal("the stream ended without a GenerateComplete")
        return self._completion

    def _complete(self, msg: generation_pb2.GenerateComplete) -> Completion:
        return Completion(
            text="".join(self._texts), token_ids=tuple(self._token_ids),
            finish_reason=_FINISH_REASONS.get(msg.finish_reason, "unspecified"),
            prompt_tokens=msg.prompt_tokens, completion_tokens=msg.completion_tokens,
            time_to_first_token_s=msg.time_to_first_token.ToNanoseconds() / 1e9,
            decode_time_s=msg.decode_time.ToNanoseconds() / 1e9,
            kv_cache_bytes=msg.kv_cache_bytes, kv_cache_slots=msg.kv_cache_slots,
            prefix_cache=_PREFIX_CACHE.get(msg.prefix_cache, ""),
            speculative=(SpeculativeUsage.from_pb(msg.speculative)
                         if msg.HasField("speculative") else None))
