"""The HTTP server of the OpenAI API: uvicorn, on the router's event loop, beside its gRPC
server. The router owns the signals (one drain for both APIs), so uvicorn captures none, and
it listens on a socket bound here, so that a port in use fails the start in one line."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp

from serving.server import StartupError
from serving.tls import TlsFiles

SHUTDOWN_GRACE_S = 1  # streams still open when the drain ends are cut after this


class _Embedded(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """``start()`` listens and returns the bound port; ``stop()`` closes the listener, lets
    running responses end within SHUTDOWN_GRACE_S, then cancels them. With ``tls``, it serves
    HTTPS with that certificate (clients need no certificate of their own)."""

    def __init__(self, app: ASGIApp, host: str, port: int, tls: TlsFiles | None = None) -> None:
        self.host, self.port, self.scheme = host, port, "http" if tls is None else "https"
        certificate = {} if tls is None else {"ssl_certfile": str(tls.cert),
                                              "ssl_keyfile": str(tls.key)}
        self.server = _Embedded(uvicorn.Config(
            app, lifespan="off", log_config=None, access_log=False, ws="none",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S, **certificate))
        self.task: asyncio.Task | None = None

    async def start(self) -> int:
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        self.task = asyncio.create_task(self.server.serve(sockets=[sock]))
        while not self.server.started:
            if self.task.done():  # it failed before listening
                self.task.result()
                raise StartupError(f"the HTTP server on {self.host}:{self.port} did not start")
            await asyncio.sleep(0.01)
        return self.port

    async def stop(self) -> None:
        if self.task is not None:
            self.server.should_exit = True
            await self.task

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}/v1"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # a restarted router may bind while old connections linger (TIME_WAIT); a second
    # listener is still refused (that would take SO_REUSEPORT)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot serve the OpenAI API on {host}:{port} ({exc.strerror}); "
                           "stop the other server or choose another --http-port (0: none)"
                           ) from None
    sock.listen(1024)
    return sock
