"""Responses of the generation endpoints: errors as OpenAI error objects, and the response
that relays one generation, cancelled as soon as its client disconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable

from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from router.flow import Event, Finished, TextChunk
from router.openai_api.errors import error_body
from router.openai_api.frames import DONE, Framer, sse

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
               (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


def error_response(exc: BaseException) -> JSONResponse:
    body = error_body(exc)
    return JSONResponse(body.json(), status_code=body.status, headers=body.headers)


class GenerationResponse(Response):
    """Waits for the first event before it answers, so that a request refused before its first
    token gets its HTTP status; then one JSON body, or a stream of events whose errors, once
    the status is sent, travel as an error event. A client that disconnects cancels the
    generation, whatever it is waiting for (a prefill, a decode step, the network)."""

    def __init__(self, events: AsyncIterator[Event], framer: Framer, stream: bool,
                 include_usage: bool) -> None:
        super().__init__()
        self.events, self.framer = events, framer
        self.stream, self.include_usage = stream, include_usage

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with contextlib.aclosing(self.events):
            await _cancel_on_disconnect(receive, self._respond(scope, receive, send))

    async def _respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            first = await anext(self.events)
            response = None if self.stream else await self._whole(first)
        except Exception as exc:
            response = error_response(exc)
        if response is not None:
            await response(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        try:
            await self._stream(send, first)
        except Exception as exc:
            await _send_body(send, sse(error_body(exc).json()) + DONE, more=False)

    async def _whole(self, event: Event) -> JSONResponse:
        chunks: list[TextChunk] = []
        while not isinstance(event, Finished):
            chunks.append(event)
            event = await anext(self.events)
        return JSONResponse(self.framer.whole(chunks, event))

    async def _stream(self, send: Send, event: Event) -> None:
        pending = self.framer.opening() or b""  # sent with the first text
        while not isinstance(event, Finished):
            frame = self.framer.delta(event)
            if frame is not None:
                await _send_body(send, pending + frame)
                pending = b""
            event = await anext(self.events)
        await _send_body(send, pending + self.framer.closing(event, self.include_usage),
                         more=False)


async def _send_body(send: Send, data: bytes, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


async def _cancel_on_disconnect(receive: Receive, work: Awaitable[None]) -> None:
    """Runs ``work`` until it ends or the client disconnects, whichever comes first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await task


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
