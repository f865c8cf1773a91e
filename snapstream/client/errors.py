"""Typed exceptions of the client, one per gRPC status code, looked up in ``ERRORS``.

Every failed call raises a :class:`SnapstreamError` subclass carrying the status ``code`` and the
server's ``details`` (which say what to change, e.g. the bad field of a request).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc


class SnapstreamError(Exception):
    """Base of every client error; ``code`` is the gRPC status, ``details`` its message;
    ``retry_after_s`` how long the server asks to wait before a retry (RESOURCE_EXHAUSTED,
    UNAVAILABLE), None when it says nothing."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str, code: grpc.StatusCode | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(details)
        self.details, self.retry_after_s = details, retry_after_s
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


class InvalidArgument(SnapstreamError):
    """The request is wrong (details name the field); retrying it unchanged fails again."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class ResourceExhausted(SnapstreamError):
    """Every worker queue is full; retry later."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(SnapstreamError):
    """The server (or a worker behind it) cannot be reached; retry later."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(SnapstreamError):
    """The call's deadline (``timeout_s``) passed before it finished."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(SnapstreamError):
    """The call was cancelled (by this client or the server)."""

    code = grpc.StatusCode.CANCELLED


class NotFound(SnapstreamError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(SnapstreamError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unimplemented(SnapstreamError):
    """The server does not offer this RPC (an older or different server)."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Unauthenticated(SnapstreamError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(SnapstreamError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Internal(SnapstreamError):
    """A server bug, or a reply that breaks the protocol."""

    code = grpc.StatusCode.INTERNAL


ERRORS: dict[grpc.StatusCode, type[SnapstreamError]] = {
    cls.code: cls
    for cls in (InvalidArgument, ResourceExhausted, Unavailable, DeadlineExceeded, Cancelled,
                NotFound, FailedPrecondition, Unimplemented, Unauthenticated, PermissionDenied,
                Internal)
}


def error_from_rpc(exc: grpc.RpcError) -> SnapstreamError:
    """The typed error for a failed call; codes without a class get the base class."""
    # Sync calls raise grpc.Call objects, asyncio calls grpc.aio.AioRpcError: both have these.
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or code.name
    retry_after_s = _retry_after(exc.trailing_metadata() if hasattr(exc, "trailing_metadata")
                                 else None)
    cls = ERRORS.get(code)
    if cls is None:
        return SnapstreamError(details, code, retry_after_s)
    return cls(details, retry_after_s=retry_after_s)


def _retry_after(metadata) -> float | None:
    """The server's ``retry-after`` trailing metadata, in seconds."""
    for key, value in metadata or ():
        if key == "retry-after":
            try:
                return float(value)
            except ValueError:
                return None
    return None


@contextmanager
def mapped_errors() -> Iterator[None]:
    """Re-raises a ``grpc.RpcError`` as its typed :class:`SnapstreamError`."""
    try:
        yield
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from exc
