"""One server interceptor maps domain exceptions to gRPC status codes with their message."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from kvstore.stores import BlobNotFound, StoreUnavailable

log = logging.getLogger(__name__)
# how long a client should wait before it retries an overloaded or unreachable service: the
# "retry-after" trailing metadata of RESOURCE_EXHAUSTED and UNAVAILABLE (Retry-After over HTTP)
RETRY_AFTER_S = 1
RETRY_CODES = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE})


class QueueFull(Exception):
    """The service's bounded queue is full: RESOURCE_EXHAUSTED, retry later or elsewhere."""


class Unavailable(Exception):
    """A dependency (worker, store) cannot be reached."""


class DraftMissing(Exception):
    """A request asks for what this worker was not started with (speculative prefill without
    --draft-model): FAILED_PRECONDITION."""


STATUS_BY_EXCEPTION: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = ()


def register_status(exc_type: type[BaseException], code: grpc.StatusCode) -> None:
    """Later registrations are more specific (checked first)."""
    global STATUS_BY_EXCEPTION
    if any(existing is exc_type for existing, _ in STATUS_BY_EXCEPTION):
        raise ValueError(f"{exc_type.__name__} already has a status code")
    STATUS_BY_EXCEPTION = ((exc_type, code), *STATUS_BY_EXCEPTION)


register_status(ValueError, grpc.StatusCode.INVALID_ARGUMENT)
register_status(QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED)
register_status(Unavailable, grpc.StatusCode.UNAVAILABLE)
register_status(StoreUnavailable, grpc.StatusCode.UNAVAILABLE)
register_status(BlobNotFound, grpc.StatusCode.NOT_FOUND)
register_status(DraftMissing, grpc.StatusCode.FAILED_PRECONDITION)
# generated servicer bases raise it for an RPC the service does not implement (Health/List)
register_status(NotImplementedError, grpc.StatusCode.UNIMPLEMENTED)


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
    return next((code for exc_type, code in STATUS_BY_EXCEPTION if isinstance(exc, exc_type)),
                None)


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    if isinstance(exc, grpc.aio.AioRpcError):  # an internal call failed: pass its status on
        code, details = exc.code(), exc.details() or exc.code().name
    else:
        code, details = status_for(exc), str(exc) or type(exc).__name__
    if code is None:
        log.exception("unhandled error", exc_info=exc)
        code = grpc.StatusCode.INTERNAL
    hint = (("retry-after", str(RETRY_AFTER_S)),) if code in RETRY_CODES else ()
    await context.abort(code, details, trailing_metadata=hint)


def _wrap_unary(behavior: Callable) -> Callable:
    async def wrapper(request, context):
        await _refuse_unparseable(request, context)
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return wrapper


def _wrap_stream(behavior: Callable) -> Callable:
    async def wrapper(request, context):
        await _refuse_unparseable(request, context)
        try:
            async for response in behavior(request, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return wrapper


class StatusInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary), _lenient(handler.request_deserializer),
                handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream), _lenient(handler.request_deserializer),
                handler.response_serializer)
        return handler
