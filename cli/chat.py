"""`snapstream chat`: an interactive conversation, streamed as it is generated.

In process by default; ``--addr HOST:PORT`` talks to a running router instead. Ctrl-C while
the model answers stops that answer (the turn is dropped); Ctrl-C or Ctrl-D at the prompt ends
the chat.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from cli.flags import (
    POLICY_FLAGS,
    add_policy_flags,
    add_sampling_flags,
    policy_from_args,
    sampling_from_args,
)
from snapstream.chat import ChatMessage
from snapstream.checkpoints.registry import MODEL_HELP
from snapstream.client import SnapstreamClient
from snapstream.tokenizer import IncrementalDetokenizer
from snapstream.weight_formats import AUTO, DTYPE_CHOICES, DTYPE_HELP

PROMPT = "you> "


def register(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--model", default=None, help=f"in process: {MODEL_HELP}")
    where.add_argument("--addr", default=None, help="a running router (host:port) instead")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO,
                        help=f"in process: {DTYPE_HELP}")
    parser.add_argument("--system", default=None, help="system message that opens the chat")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    add_policy_flags(parser)
    add_sampling_flags(parser)


@dataclass
class Conversation:
    messages: list[dict[str, str]] = field(default_factory=list)

    def ask(self, text: str) -> list[dict[str, str]]:
        return [*self.messages, {"role": "user", "content": text}]

    def commit(self, asked: list[dict[str, str]], answer: str) -> None:
        self.messages = [*asked, {"role": "assistant", "content": answer}]


class LocalChat:
    """The in-process engine; the text streams through an incremental detokenizer."""

    def __init__(self, args: argparse.Namespace) -> None:
        from snapstream.engine import Engine

        self.engine = Engine.from_pretrained(args.model, dtype=args.dtype)
        if self.engine.tokenizer.chat_template is None:
            raise ValueError(f"{self.engine.name} has no chat template: use snapstream "
                             "generate --prompt")
        self.policy = policy_from_args(args, self.engine.default_policy)
        self.sampling = sampling_from_args(args)
        self.max_new_tokens = args.max_new_tokens

    def answer(self, messages: list[dict[str, str]]) -> Iterator[str]:
        tokenizer = self.engine.tokenizer
        prompt = tokenizer.render_chat([ChatMessage(**m) for m in messages])
        stop = self.engine.stop_ids(self.sampling)
        detok = IncrementalDetokenizer(tokenizer)
        for token in self.engine.stream(prompt, self.max_new_tokens, self.policy, self.sampling):
            if token not in stop:
                yield detok.feed([token])
        yield detok.flush()


class RemoteChat:
    """A router, through the client SDK; leaving an answer early cancels its call."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.client = SnapstreamClient(args.addr)
        if not self.client.info().has_chat_template:
            raise ValueError(f"the model served at {args.addr} has no chat template")
        given = {name: getattr(args, name) for name in POLICY_FLAGS}
        self.options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                            top_k=args.top_k, top_p=args.top_p, seed=args.seed, **given)

    def answer(self, messages: list[dict[str, str]]) -> Iterator[str]:
        with self.client.chat_stream(messages, **self.options) as stream:
            for chunk in stream:
                yield chunk.text


def run(args: argparse.Namespace) -> int:
    if args.addr and args.dtype != AUTO:
        raise ValueError("--dtype is the in-process engine's: a router's workers have their own")
    chat = RemoteChat(args) if args.addr else LocalChat(args)
    conversation = Conversation()
    if args.system:
        conversation.messages.append({"role": "system", "content": args.system})
    print("chat: Ctrl-C stops an answer, Ctrl-D or Ctrl-C at the prompt quits", file=sys.stderr)
    while (text := _read_turn()) is not None:
        if not text.strip():
            continue
        asked = conversation.ask(text)
        pieces: list[str] = []
        try:
            for piece in chat.answer(asked):
                pieces.append(piece)
                print(piece, end="", flush=True)
        except KeyboardInterrupt:
            print("\n[answer stopped; the turn is dropped]", file=sys.stderr)
            continue
        print()
        conversation.commit(asked, "".join(pieces))
    return 0


def _read_turn() -> str | None:
    try:
        return input(PROMPT)
    except (EOFError, KeyboardInterrupt):
        print(file=sys.stderr)
        return None
