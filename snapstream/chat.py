"""Chat messages and the model's chat template (Jinja2, rendered in a sandbox).

A checkpoint's template is untrusted code, so it runs in Jinja2's immutable sandbox with the
environment transformers gives templates: ``trim_blocks``/``lstrip_blocks``, loop controls, a
``tojson`` filter, ``raise_exception`` and ``strftime_now``, and the ``{% generation %}`` block
(rendered as its body).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Protocol

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "user", "assistant", "tool")
# a base model (no chat template) is asked in plain text: the messages' contents, then this cue
PLAIN_ANSWER_CUE = "\n\nAnswer:"


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role: unknown {self.role!r} (use one of {list(ROLES)})")


class TemplateError(ValueError):
    """The chat template refused the conversation or failed to render it."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text; it renders its body."""

    tags = frozenset({"generation"})

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def _raise_exception(message: str):
    raise TemplateError(f"chat template: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    special_tokens: tuple[tuple[str, str], ...] = ()  # (name, text): bos_token, eos_token

    @cached_property
    def _template(self) -> jinja2.Template:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True,
            extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        try:
            return env.from_string(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"chat template does not parse: {exc}") from None

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
        if not messages:
            raise ValueError("messages: give at least one message")
        conversation = [{"role": m.role, "content": m.content} for m in messages]
        try:
            return self._template.render(
                messages=conversation, add_generation_prompt=add_generation_prompt,
                tools=None, documents=None, **dict(self.special_tokens))
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed on these messages: {exc}") from None


class HasChatTemplate(Protocol):
    chat_template: object | None


def model_format(tokenizer: HasChatTemplate) -> str:
    """How a model is asked: ``chat`` (its chat template) where it has one, ``raw`` (plain
    text, :func:`render_plain`) for a base model: it has none, and continues text."""
    return "raw" if tokenizer.chat_template is None else "chat"


def render_plain(contents: Sequence[str]) -> str:
    """A conversation as a base model reads it: the contents one after another, then the
    answer cue (the model continues after ``Answer:``)."""
    return "\n\n".join(contents) + PLAIN_ANSWER_CUE
