"""A request's text pieces (each message's content) and where each lies in a model's rendering.

The draft reads a request in its own format (its chat template, or the plain text a base model
reads: :func:`render_own`), the target in its own; the pieces tie the two texts together. A
character of a piece maps to the same character of that piece in the other text; template
text between pieces maps to the other's template text only where the two are the same string
(a draft of the target's family), else to nothing (the target's template tokens are kept
anyway). Torch-free: the router renders and locates the target's pieces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from snapstream.chat import ChatMessage, model_format, render_plain
from snapstream.tokenizer import Tokenizer


@dataclass(frozen=True)
class Request:
    """What the client asked, as text: its messages, or a text prompt (one user message,
    ``is_chat`` False: a base model reads it as it is)."""

    messages: tuple[ChatMessage, ...]
    is_chat: bool

    @classmethod
    def completion(cls, text: str) -> Request:
        return cls((ChatMessage("user", text),), is_chat=False)

    def __post_init__(self) -> None:
        if not self.messages:
            raise ValueError("speculative prompt: give at least one message")
        if not self.is_chat and len(self.messages) != 1:
            raise ValueError("speculative prompt: a text prompt is one message")


@dataclass(frozen=True)
class Piece:
    """Characters [content_start, content_start + length) of a message's content lie at
    [text_start, text_start + length) of a rendered prompt."""

    text_start: int
    content_start: int
    length: int


@dataclass(frozen=True)
class Rendering:
    """A prompt's text and, for each message of its request, where its content lies in it."""

    text: str
    pieces: tuple[Piece, ...]


def locate(text: str, contents: Sequence[str], who: str) -> tuple[Piece, ...]:
    """Each content's place in ``text``, in order (a template that trims a content: its
    stripped characters). ValueError when one is not there."""
    pieces, cursor = [], 0
    for i, content in enumerate(contents):
        stripped = content.strip()
        found = text.find(content, cursor)
        start, lead, length = found, 0, len(content)
        if found < 0:
            start = text.find(stripped, cursor)
            lead, length = len(content) - len(content.lstrip()), len(stripped)
        if start < 0:
            raise ValueError(f"{who}: its chat template does not render message {i}'s content "
                             "as it is; speculative prefill maps text through the contents")
        pieces.append(Piece(start, lead, length))
        cursor = start + length
    return tuple(pieces)


def render_served(tokenizer: Tokenizer, request: Request, who: str = "target model"
                  ) -> Rendering:
    """``request`` as the services give it to a model: messages through its chat template, a
    text prompt as it is."""
    if not request.is_chat:
        text = request.messages[0].content
        return Rendering(text, (Piece(0, 0, len(text)),))
    text = tokenizer.render_chat(request.messages)
    return Rendering(text, locate(text, [m.content for m in request.messages], who))


def _chat(tokenizer: Tokenizer, request: Request) -> Rendering:
    as_chat = Request(request.messages, is_chat=True)  # a text prompt: one user message
    return render_served(tokenizer, as_chat, "draft model")


def _raw(tokenizer: Tokenizer, request: Request) -> Rendering:
    if not request.is_chat:
        return render_served(tokenizer, request, "draft model")
    contents = [m.content for m in request.messages]
    text = render_plain(contents)
    return Rendering(text, locate(text, contents, "draft model"))


# model_format -> how a draft of that kind renders a request: what it reads as the target
OWN_FORMATS: dict[str, Callable[[Tokenizer, Request], Rendering]] = {"chat": _chat, "raw": _raw}


def render_own(tokenizer: Tokenizer, request: Request) -> Rendering:
    """``request`` as the model of ``tokenizer`` reads it: an instruct model through its chat
    template (a text prompt as one user message), a base model as plain text (a text prompt as
    it is, messages by :func:`~snapstream.chat.render_plain`)."""
    return OWN_FORMATS[model_format(tokenizer)](tokenizer, request)


def links(source: Rendering, dest: Rendering) -> list[tuple[int, int, int]]:
    """(source_start, dest_start, length) character ranges of ``source`` that stand for the
    same characters of ``dest``: the pieces' common content, and the template text between
    pieces where the two have the same string."""
    if len(source.pieces) != len(dest.pieces):
        raise ValueError(f"renderings of {len(source.pieces)} and {len(dest.pieces)} messages")
    out = []
    for a, b in zip(source.pieces, dest.pieces, strict=True):
        first = max(a.content_start, b.content_start)
        last = min(a.content_start + a.length, b.content_start + b.length)
        if last > first:
            out.append((a.text_start + first - a.content_start,
                        b.text_start + first - b.content_start, last - first))
    for (a0, a1), (b0, b1) in zip(_gaps(source), _gaps(dest), strict=True):
        if a1 > a0 and source.text[a0:a1] == dest.text[b0:b1]:
            out.append((a0, b0, a1 - a0))
    return sorted(out)


def _gaps(rendering: Rendering) -> list[tuple[int, int]]:
    """[start, end) of the template text before each piece and after the last."""
    bounds = [(p.text_start, p.text_start + p.length) for p in rendering.pieces]
    starts = [0, *(end for _, end in bounds)]
    ends = [*(start for start, _ in bounds), len(rendering.text)]
    return list(zip(starts, ends, strict=True))
