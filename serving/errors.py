"""Request errors apart from internal faults, and the one interceptor that maps exceptions to
gRPC status codes.

A client's mistake is a :class:`RequestError`: INVALID_ARGUMENT (HTTP 400), its message naming
the field. The other expected failures are listed in ``STATUS_BY_EXCEPTION``. Anything else is an
internal fault: INTERNAL (HTTP 500) with the request's id in the answer and the traceback, under
that id, in the service's log; its message never reaches the client.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

import grpc

from hwsim.memory import DoesNotFitError
from kvstore.blob_errors import BlobCorrupted, BlobError, BlobTokensMismatch, BlobTruncated
from kvstore.stores import BlobNotFound, StoreFull, StoreUnavailable
from snapstream.memory import MemoryExhausted

log = logging.getLogger(__name__)
# how long a client should wait before it retries an overloaded or unreachable service: the
# "retry-after" trailing metadata of RESOURCE_EXHAUSTED and UNAVAILABLE (Retry-After over HTTP)
RETRY_AFTER_S = 1
RETRY_CODES = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE})
REQUEST_ID_KEY = "request-id"  # trailing metadata of an INTERNAL answer


class RequestError(Exception):
    """The client's mistake: INVALID_ARGUMENT (HTTP 400). The message names the field and says
    what to change; ``field`` names it alone (the HTTP error object's ``param``)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class QueueFull(Exception):
    """The service's bounded queue is full: RESOURCE_EXHAUSTED, retry later or elsewhere."""


class Unavailable(Exception):
    """A dependency (worker, store) cannot be reached."""


class OverQuota(Exception):
    """The caller's tenant is over one of its quotas (the message names the limit):
    RESOURCE_EXHAUSTED, retry later."""


class DraftMissing(Exception):
    """A request asks for what this worker was not started with (speculative prefill without
    --draft-model): FAILED_PRECONDITION."""


# the first entry whose type the exception is an instance of gives its code
STATUS_BY_EXCEPTION: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (RequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (OverQuota, grpc.StatusCode.RESOURCE_EXHAUSTED),
    # work a worker's memory limit cannot hold (a prompt too long for its activations)
    (MemoryExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StoreFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
    (BlobNotFound, grpc.StatusCode.NOT_FOUND),
    # a blob that fails its MAC or its checks (deleted): the router prefills the request again
    (BlobCorrupted, grpc.StatusCode.DATA_LOSS),
    (BlobTruncated, grpc.StatusCode.DATA_LOSS),
    (BlobTokensMismatch, grpc.StatusCode.DATA_LOSS),
    # a blob of another model, layout or format version than the decode worker's
    (BlobError, grpc.StatusCode.FAILED_PRECONDITION),
    (DraftMissing, grpc.StatusCode.FAILED_PRECONDITION),
    # the sn40l-sim back end's static graph does not fit the simulated memory
    (DoesNotFitError, grpc.StatusCode.FAILED_PRECONDITION),
    # generated servicer bases raise it for an RPC the service does not implement (Health/List)
    (NotImplementedError, grpc.StatusCode.UNIMPLEMENTED),
)

# the id of the request this task serves: the caller's (an internal request carries the
# router's ``request_id``), else a new one; set by the interceptor and by the HTTP API
REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="")


def new_request_id() -> str:
    return uuid.uuid4().hex


def current_request_id() -> str:
    """The id of the request this task serves (a new one, from now on, when none was set)."""
    request_id = REQUEST_ID.get()
    if not request_id:
        request_id = new_request_id()
        REQUEST_ID.set(request_id)
    return request_id


def internal_error_message(exc: BaseException, service: str) -> str:
    """Logs ``exc`` with its traceback under the current request id; -> what the client is told
    (the id, never the exception's text)."""
    request_id = current_request_id()
    log.error("request %s: internal error in the %s", request_id, service, exc_info=exc)
    return f"internal error (request id {request_id}); the {service}'s log has the details"


@dataclass(frozen=True)
class Unparseable:
    """Stands for a request body that does not parse (invalid UTF-8 in a string, truncated
    bytes): the handler answers INVALID_ARGUMENT instead of gRPC's UNKNOWN."""

    error: Exception


def _lenient(deserializer: Callable[[bytes], object] | None
             ) -> Callable[[bytes], object] | None:
    if deserializer is None:
        return None

    def parse(data: bytes) -> object:
        try:
            return deserializer(data)
        except Exception as exc:
            return Unparseable(exc)

    return parse


async def _refuse_unparseable(request: object, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, Unparseable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"the request body does not parse ({request.error}); send a valid "
                            "protobuf message (strings must be UTF-8)")


def status_for(exc: BaseException) -> grpc.StatusCode | None:
    """The code of an expected failure; None for an internal fault."""
    return next((code for exc_type, code in STATUS_BY_EXCEPTION if isinstance(exc, exc_type)),
                None)


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException, service: str) -> None:
    metadata: tuple[tuple[str, str], ...] = ()
    if isinstance(exc, grpc.aio.AioRpcError):  # an internal call failed: pass its status on
        code, details = exc.code(), exc.details() or exc.code().name
    else:
        code, details = status_for(exc), str(exc) or type(exc).__name__
    if code is None:
        code, details = grpc.StatusCode.INTERNAL, internal_error_message(exc, service)
    if code == grpc.StatusCode.INTERNAL:
        metadata = ((REQUEST_ID_KEY, current_request_id()),)
    if code in RETRY_CODES:
        metadata = (("retry-after", str(RETRY_AFTER_S)),)
    await context.abort(code, details, trailing_metadata=metadata)


def _start(request: object) -> None:
    """The call's request id: the one an internal request carries, else a new one."""
    REQUEST_ID.set(getattr(request, "request_id", "") or new_request_id())


def _wrap_unary(behavior: Callable, service: str) -> Callable:
    async def wrapper(request, context):
        await _refuse_unparseable(request, context)
        _start(request)
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc, service)

    return wrapper


def _wrap_stream(behavior: Callable, service: str) -> Callable:
    async def wrapper(request, context):
        await _refuse_unparseable(request, context)
        _start(request)
        try:
            async for response in behavior(request, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc, service)

    return wrapper


class StatusInterceptor(grpc.aio.ServerInterceptor):
    """``service`` names the service in an internal error's answer (whose log to read)."""

    def __init__(self, service: str = "server") -> None:
        self.service = service

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary, self.service),
                _lenient(handler.request_deserializer),
                handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream, self.service),
                _lenient(handler.request_deserializer),
                handler.response_serializer)
        return handler
