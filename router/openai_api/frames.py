"""The shared generation's events as OpenAI objects: one response body, or server-sent
events (``data: {json}\\n\\n`` per chunk, ``data: [DONE]`` last).

Chat and text completions differ only in names and in where the text goes; a ``Flavor``
holds those differences. The ``Finished`` event gives the finish reason and ``usage``; its
details the OpenAI schema has no room for (the native finish reason, the KV cache as it
travelled, time to first token) go in a ``snapstream`` object.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from router.flow import Finished, TextChunk
from serving.speculative import POSITIONS_FROM_PB
from snapstream.v1 import common_pb2

FINISH_REASONS = {"length": "length", "context_length": "length", "stop_token": "stop",
                  "stop_string": "stop"}
DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Flavor:
    object: str  # of a whole response
    chunk_object: str  # of a streamed chunk
    id_prefix: str
    whole: Callable[[str], dict]  # the text -> the choice's fields
    delta: Callable[[str], dict]  # a piece of the text -> a chunk's choice fields
    finish: dict  # the last chunk's choice fields, beside its finish reason
    opening: dict | None = None  # the first chunk's choice fields, before any text


CHAT = Flavor("chat.completion", "chat.completion.chunk", "chatcmpl-",
              whole=lambda text: {"message": {"role": "assistant", "content": text}},
              delta=lambda text: {"delta": {"content": text}}, finish={"delta": {}},
              opening={"delta": {"role": "assistant", "content": ""}})
TEXT = Flavor("text_completion", "text_completion", "cmpl-",
              whole=lambda text: {"text": text}, delta=lambda text: {"text": text},
              finish={"text": ""})


def usage(done: Finished) -> dict:
    """OpenAI's usage; for a request that marked a document, what happened to it
    (``"snapstream": {"prefix_cache": "stored" | "hit" | "bypass"}``, and with a bypass its
    ``prefix_cache_reason``: over_cap, store_full, store_unavailable)."""
    counts = {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
              "total_tokens": done.prompt_tokens + done.completion_tokens}
    if done.prefix_cache:
        counts["snapstream"] = {"prefix_cache": done.prefix_cache}
        if done.prefix_cache_reason:
            counts["snapstream"]["prefix_cache_reason"] = done.prefix_cache_reason
    return counts


def details(done: Finished) -> dict:
    out = {"finish_reason": done.finish_reason, "kv_cache_bytes": done.kv_cache_bytes,
           "kv_cache_slots": done.kv_cache_slots,
           "time_to_first_token_s": round(done.time_to_first_token_s, 6),
           "decode_time_s": round(done.decode_time_s, 6)}
    if done.speculative is not None:
        out["speculative"] = speculative_details(done.speculative)
    return out


def speculative_details(report: common_pb2.SpeculativeReport) -> dict:
    return {"draft_time_s": round(report.draft_time.ToNanoseconds() / 1e9, 6),
            "target_prefill_time_s": round(report.target_prefill_time.ToNanoseconds() / 1e9, 6),
            "kept_tokens": report.kept_tokens, "prompt_tokens": report.prompt_tokens,
            "kept_share": round(report.kept_tokens / max(report.prompt_tokens, 1), 4),
            "skipped": report.skipped, "positions": POSITIONS_FROM_PB[report.positions]}


@dataclass(frozen=True)
class Framer:
    """Builds one request's objects; ``with_token_ids`` adds each choice's ``token_ids``."""

    flavor: Flavor
    model: str
    fingerprint: str | None
    with_token_ids: bool = False
    id: str = ""
    created: int = 0

    @classmethod
    def new(cls, flavor: Flavor, model: str, fingerprint: str, with_token_ids: bool) -> Framer:
        return cls(flavor, model, fingerprint or None, with_token_ids,
                   flavor.id_prefix + uuid.uuid4().hex, int(time.time()))

    def _head(self, object_name: str) -> dict:
        return {"id": self.id, "object": object_name, "created": self.created,
                "model": self.model, "system_fingerprint": self.fingerprint}

    def _choice(self, fields: dict, token_ids: tuple[int, ...] | None,
                finish_reason: str | None) -> dict:
        choice = {"index": 0, **fields, "logprobs": None, "finish_reason": finish_reason}
        if self.with_token_ids and token_ids is not None:
            choice["token_ids"] = list(token_ids)
        return choice

    def whole(self, chunks: list[TextChunk], done: Finished) -> dict:
        text = "".join(chunk.text for chunk in chunks)
        token_ids = tuple(t for chunk in chunks for t in chunk.token_ids)
        choice = self._choice(self.flavor.whole(text), token_ids,
                              FINISH_REASONS[done.finish_reason])
        return {**self._head(self.flavor.object), "choices": [choice], "usage": usage(done),
                "snapstream": details(done)}

    def opening(self) -> bytes | None:
        if self.flavor.opening is None:
            return None
        return self._event([self._choice(self.flavor.opening, None, None)])

    def delta(self, chunk: TextChunk) -> bytes | None:
        """None for a chunk with nothing to show (its text held back, no token ids asked)."""
        if not chunk.text and not (self.with_token_ids and chunk.token_ids):
            return None
        return self._event([self._choice(self.flavor.delta(chunk.text), chunk.token_ids, None)])

    def closing(self, done: Finished, include_usage: bool) -> bytes:
        """The finish reason; then, when asked, a chunk with no choices and the usage."""
        finish = self._choice(self.flavor.finish, (), FINISH_REASONS[done.finish_reason])
        frames = self._event([finish], snapstream=details(done))
        if include_usage:
            frames += self._event([], usage=usage(done))
        return frames + DONE

    def _event(self, choices: list[dict], **extra) -> bytes:
        return sse({**self._head(self.flavor.chunk_object), "choices": choices, **extra})


def sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"
