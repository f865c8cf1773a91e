"""How a sample's pieces become the model's input, looked up by name in ``PROMPT_FORMATS``.

The body is ``{intro}\\n\\n{context}\\n\\n{question}`` (question after the context) or
``{intro}\\n\\n{question}\\n\\n{context}`` (before). Then:

- ``raw``: ``{body}\\n\\nAnswer: {cue}``, a plain completion;
- ``chat``: the body as the user's message through the model's chat template, and the
  assistant's turn opened with ``{cue}``.

The cue starts the answer (``The pass key is``), so the value is what the model writes next.
:func:`model_format` is the format a model is asked in unless told otherwise: ``chat`` where
it has a chat template, ``raw`` for a base model (it has none, and continues text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from evaldata.sample import Placement
from snapstream.chat import ChatMessage, model_format, render_plain

__all__ = ["PROMPT_FORMATS", "PromptParts", "model_format", "render"]


class TokenizerLike(Protocol):
    chat_template: object | None

    def encode(self, text: str) -> list[int]: ...

    def render_chat(self, messages: Sequence[ChatMessage]) -> str: ...


@dataclass(frozen=True)
class PromptParts:
    intro: str
    context: str
    question: str
    cue: str
    placement: Placement

    @property
    def body(self) -> str:
        if self.placement is Placement.AFTER:
            return f"{self.intro}\n\n{self.context}\n\n{self.question}"
        return f"{self.intro}\n\n{self.question}\n\n{self.context}"


def _raw(tokenizer: TokenizerLike, parts: PromptParts) -> str:
    return f"{render_plain([parts.body])} {parts.cue}"


def _chat(tokenizer: TokenizerLike, parts: PromptParts) -> str:
    return tokenizer.render_chat([ChatMessage("user", parts.body)]) + parts.cue


PROMPT_FORMATS: dict[str, Callable[[TokenizerLike, PromptParts], str]] = {
    "raw": _raw,
    "chat": _chat,
}


def render(fmt: str, tokenizer: TokenizerLike, parts: PromptParts) -> str:
    if fmt not in PROMPT_FORMATS:
        raise ValueError(f"prompt_format must be one of {', '.join(PROMPT_FORMATS)}, "
                         f"got {fmt!r}")
    return PROMPT_FORMATS[fmt](tokenizer, parts)
