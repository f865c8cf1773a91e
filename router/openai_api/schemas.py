"""Request bodies of the OpenAI API as pydantic models: strict JSON types (``"12"`` is not a
number), unknown fields refused, and the fields OpenAI defines that this server does not
implement declared, so that ``convert`` can name them in its refusal.

Ranges that the native request checks (``max_tokens`` against the context, ``temperature``,
``top_p``, the cache policy's sizes) are left to it, so both APIs give the same messages; the
bounds here are only those of the native fields' types.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from serving.convert import KIND_TO_PB, OBSERVE_TO_PB, POOLING_TO_PB, UNIT_TO_PB
from serving.speculative import POSITIONS_TO_PB

UInt32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
UInt64 = Annotated[int, Field(ge=0, le=2**64 - 1)]


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)


class SpeculativeOptions(Body):
    """``snapstream.speculative``: speculative prefill (as the native ``SpeculativeSettings``;
    ``{}`` takes the prefill worker's defaults). ``keep`` is a share in (0, 1], checked by the
    native request; ``draft_model`` is ``"auto"`` (the prefill worker's draft) or that draft's
    name."""

    keep: float | None = None
    keep_tokens: UInt32 | None = None
    chunk_size: UInt32 | None = None
    look_ahead: UInt32 | None = None
    positions: Literal[tuple(POSITIONS_TO_PB)] | None = None
    draft_model: str | None = None


class SnapstreamOptions(Body):
    """The ``snapstream`` extension object: the request's cache policy (unset fields take the
    served model's default, as in the native ``CachePolicy``), whether each choice carries
    its token ids, the reusable document at the start of the prompt, and speculative prefill."""

    policy: Literal[tuple(KIND_TO_PB)] | None = None
    n_sink: UInt32 | None = None
    n_topk: UInt32 | None = None
    n_recent: UInt32 | None = None
    observation: UInt32 | None = None
    kernel: UInt32 | None = None
    pooling: Literal[tuple(POOLING_TO_PB)] | None = None
    # "opening": SnapKV's window also reads the last message's opening again after the prompt
    # (a question placed before its document)
    observe: Literal[tuple(OBSERVE_TO_PB)] | None = None
    # "word": SnapKV keeps a word's tokens together (a number, an identifier)
    unit: Literal[tuple(UNIT_TO_PB)] | None = None
    return_token_ids: bool = False
    # a reusable document (compress once, ask many): chat's "system" message or messages up
    # to the "first_user" one; a completion's first N characters
    cache_prefix: str | None = None
    cache_prefix_chars: UInt32 | None = None
    # the document cache is the caller's tenant's; requests that also share this salt share
    # their documents (the others of the tenant do not see them)
    cache_salt: str | None = None
    speculative: SpeculativeOptions | None = None


class StreamOptions(Body):
    include_usage: bool = False


class GenerationBody(Body):
    """What chat and text completions share."""

    model: str
    max_tokens: UInt32 | None = None
    max_completion_tokens: UInt32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: UInt32 | None = None  # not OpenAI's; vLLM, SGLang and llama.cpp take it too
    seed: UInt64 | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # an end-user id for the caller's own records: accepted, unused
    snapstream: SnapstreamOptions | None = None
    # OpenAI's, not implemented: a value other than the no-op one is refused by name
    logprobs: Any = None
    top_logprobs: Any = None
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    best_of: Any = None
    echo: Any = None
    suffix: Any = None

    @property
    def options(self) -> SnapstreamOptions:
        return self.snapstream or SnapstreamOptions()

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(Body):
    type: Literal["text"]
    text: str


class ChatMessageBody(Body):
    role: str  # checked by the native request, as gRPC's roles are
    content: str | list[TextPart]
    name: str | None = None  # accepted; chat templates do not use it


class ChatCompletionBody(GenerationBody):
    messages: list[ChatMessageBody]


TokenId = Annotated[int, Field(ge=0, le=2**32 - 1)]


class CompletionBody(GenerationBody):
    prompt: str | list[TokenId] | list[str]
