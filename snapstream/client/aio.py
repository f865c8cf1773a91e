"""asyncio client of the public ``snapstream.v1.Generation`` service; the same API as
:class:`~snapstream.client.sync.SnapstreamClient` with awaitables."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Unpack

import grpc

from snapstream.client.auth import key_metadata
from snapstream.client.errors import Cancelled, mapped_errors
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


class AsyncGenerationStream(AsyncIterator[Chunk]):
    """The chunks of one generation as they arrive; ``await result()`` drains the rest and
    returns the Completion. Leaving an ``async with`` block (or ``cancel()``) cancels the call."""

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        self._call = call
        self._builder = CompletionBuilder()
        self._is_done = False
        self._is_cancelled = False

    async def __anext__(self) -> Chunk:
        while not self._is_done:
            message = await self._read()
            if message is grpc.aio.EOF:
                self._is_done = True
                self._builder.finish()  # raises if the final message never came
            elif (chunk := self._builder.add(message)) is not None:
                return chunk
        raise StopAsyncIteration

    async def result(self) -> Completion:
        async for _ in self:
            pass
        return self._builder.finish()

    def cancel(self) -> None:
        self._is_cancelled = True
        self._call.cancel()

    async def _read(self) -> generation_pb2.GenerateResponse:
        try:
            with mapped_errors():
                return await self._call.read()
        except asyncio.CancelledError:
            if self._is_cancelled:  # cancel() ended the call, not this task
                raise Cancelled("the call was cancelled by the client") from None
            raise

    async def __aenter__(self) -> AsyncGenerationStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.cancel()


class AsyncSnapstreamClient:
    """``timeout_s`` is the default deadline of every call (None: no deadline); each call may
    pass its own. ``api_key`` (default: ``$SNAPSTREAM_API_KEY``) is sent as ``authorization:
    Bearer KEY`` with every call. Errors are raised as :class:`SnapstreamError` subclasses."""

    def __init__(self, target: str = "localhost:50051", *, tls: TlsConfig | None = None,
                 timeout_s: float | None = None, api_key: str | None = None) -> None:
        self._timeout_s = call_timeout(None, timeout_s)
        self._metadata = key_metadata(api_key)
        if tls is None:
            self._channel = grpc.aio.insecure_channel(target)
        else:
            self._channel = grpc.aio.secure_channel(target, tls.credentials(),
                                                    options=tls.channel_options())
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)

    def generate_stream(self, prompt: Prompt, *, timeout_s: float | None = None,
                        **options: Unpack[GenerateOptions]) -> AsyncGenerationStream:
        """``prompt`` is text or token ids; see GenerateOptions for the options."""
        return self._stream(build_request(prompt, **options), timeout_s)

    async def generate(self, prompt: Prompt, *, timeout_s: float | None = None,
                       **options: Unpack[GenerateOptions]) -> Completion:
        return await self.generate_stream(prompt, timeout_s=timeout_s, **options).result()

    def chat_stream(self, messages: Messages, *, timeout_s: float | None = None,
                    **options: Unpack[GenerateOptions]) -> AsyncGenerationStream:
        """``messages``: ``[{"role": "user", "content": "..."}, ...]``, rendered with the
        model's chat template; the answer ends at the model's end-of-turn token."""
        return self._stream(build_chat_request(messages, **options), timeout_s)

    async def chat(self, messages: Messages, *, timeout_s: float | None = None,
                   **options: Unpack[GenerateOptions]) -> Completion:
        return await self.chat_stream(messages, timeout_s=timeout_s, **options).result()

    def _stream(self, request: generation_pb2.GenerateRequest, timeout_s: float | None
                ) -> AsyncGenerationStream:
        return AsyncGenerationStream(self._stub.Generate(
            request, timeout=call_timeout(timeout_s, self._timeout_s), metadata=self._metadata))

    async def info(self, *, timeout_s: float | None = None) -> ModelInfo:
        with mapped_errors():
            response = await self._stub.Info(generation_pb2.InfoRequest(),
                                             timeout=call_timeout(timeout_s, self._timeout_s),
                                             metadata=self._metadata)
        return ModelInfo.from_pb(response)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncSnapstreamClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
