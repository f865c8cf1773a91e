"""Blocking client of the public ``snapstream.v1.Generation`` service."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Unpack

import grpc

from snapstream.client.auth import key_metadata
from snapstream.client.errors import mapped_errors
from snapstream.client.request import (
    GenerateOptions,
    Messages,
    Prompt,
    build_chat_request,
    build_request,
    call_timeout,
)
from snapstream.client.results import Chunk, Completion, CompletionBuilder, ModelInfo
from snapstream.client.tls import TlsConfig
from snapstream.v1 import generation_pb2, generation_pb2_grpc


class GenerationStream(Iterator[Chunk]):
    """The chunks of one generation as they arrive; ``result()`` drains the rest and returns the
    Completion. Leaving a ``with`` block (or ``cancel()``) cancels the call on the server."""

    def __init__(self, call: Iterator[generation_pb2.GenerateResponse]) -> None:
        self._call = call
        self._builder = CompletionBuilder()
        self._is_done = False

    def __next__(self) -> Chunk:
        while not self._is_done:
            with mapped_errors():
                message = next(self._call, None)
            if message is None:
                self._is_done = True
                self._builder.finish()  # raises if the final message never came
            elif (chunk := self._builder.add(message)) is not None:
                return chunk
        raise StopIteration

    def result(self) -> Completion:
        for _ in self:
            pass
        return self._builder.finish()

    def cancel(self) -> None:
        self._call.cancel()

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cancel()


class SnapstreamClient:
    """``timeout_s`` is the default deadline of every call (None: no deadline); each call may
    pass its own. ``api_key`` (default: ``$SNAPSTREAM_API_KEY``) is sent as ``authorization:
    Bearer KEY`` with every call. Errors are raised as :class:`SnapstreamError` subclasses."""

    def __init__(self, target: str = "localhost:50051", *, tls: TlsConfig | None = None,
                 timeout_s: float | None = None, api_key: str | None = None) -> None:
        self._timeout_s = call_timeout(None, timeout_s)
        self._metadata = key_metadata(api_key)
        if tls is None:
            self._channel = grpc.insecure_channel(target)
        else:
            self._channel = grpc.secure_channel(target, tls.credentials(),
                                                options=tls.channel_options())
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)

    def generate_stream(self, prompt: Prompt, *, timeout_s: float | None = None,
                        **options: Unpack[GenerateOptions]) -> GenerationStream:
        """``prompt`` is text or token ids; see GenerateOptions for the options."""
        return self._stream(build_request(prompt, **options), timeout_s)

    def generate(self, prompt: Prompt, *, timeout_s: float | None = None,
                 **options: Unpack[GenerateOptions]) -> Completion:
        return self.generate_stream(prompt, timeout_s=timeout_s, **options).result()

    def chat_stream(self, messages: Messages, *, timeout_s: float | None = None,
                    **options: Unpack[GenerateOptions]) -> GenerationStream:
        """``messages``: ``[{"role": "user", "content": "..."}, ...]``, rendered with the
        model's chat template; the answer ends at the model's end-of-turn token."""
        return self._stream(build_chat_request(messages, **options), timeout_s)

    def chat(self, messages: Messages, *, timeout_s: float | None = None,
             **options: Unpack[GenerateOptions]) -> Completion:
        return self.chat_stream(messages, timeout_s=timeout_s, **options).result()

    def _stream(self, request: generation_pb2.GenerateRequest, timeout_s: float | None
                ) -> GenerationStream:
        return GenerationStream(self._stub.Generate(
            request, timeout=call_timeout(timeout_s, self._timeout_s), metadata=self._metadata))

    def info(self, *, timeout_s: float | None = None) -> ModelInfo:
        with mapped_errors():
            response = self._stub.Info(generation_pb2.InfoRequest(),
                                       timeout=call_timeout(timeout_s, self._timeout_s),
                                       metadata=self._metadata)
        return ModelInfo.from_pb(response)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> SnapstreamClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
