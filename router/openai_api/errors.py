"""Errors as OpenAI error objects with the HTTP status that matches the gRPC status code the
native API gives for the same failure (one mapping: exception -> gRPC code -> HTTP status).
An internal fault is a 500 that names the request's id, never the fault."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pydantic

from serving.errors import RETRY_AFTER_S, RequestError, internal_error_message, status_for


class ApiError(Exception):
    """An error the HTTP layer itself finds (no such model, a body too large or not JSON)."""

    def __init__(self, status: int, message: str, *, code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


@dataclass(frozen=True)
class HttpStatus:
    status: int
    type: str
    code: str | None = None


HTTP_BY_GRPC: dict[grpc.StatusCode, HttpStatus] = {
    grpc.StatusCode.INVALID_ARGUMENT: HttpStatus(400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: HttpStatus(401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: HttpStatus(403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: HttpStatus(404, "not_found_error"),
    # the server was not started with what the request needs (a draft model): its message
    # says which setting
    grpc.StatusCode.FAILED_PRECONDITION: HttpStatus(412, "invalid_request_error",
                                                    "failed_precondition"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: HttpStatus(429, "rate_limit_error", "overloaded"),
    grpc.StatusCode.UNIMPLEMENTED: HttpStatus(501, "server_error", "not_implemented"),
    grpc.StatusCode.UNAVAILABLE: HttpStatus(503, "server_error", "unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: HttpStatus(504, "server_error", "timeout"),
}
INTERNAL = HttpStatus(500, "server_error", "internal_error")


@dataclass(frozen=True)
class ErrorBody:
    status: int
    message: str
    type: str
    code: str | None = None
    param: str | None = None

    def json(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(RETRY_AFTER_S)} if self.status in (429, 503) else {}


def error_body(exc: BaseException) -> ErrorBody:
    if isinstance(exc, ApiError):
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        return ErrorBody(exc.status, str(exc), kind, exc.code, exc.param)
    if isinstance(exc, pydantic.ValidationError):
        return _invalid_body(exc)
    if isinstance(exc, grpc.aio.AioRpcError):  # an internal call failed: pass its status on
        code, message = exc.code(), exc.details() or exc.code().name
    else:
        code, message = status_for(exc), str(exc) or type(exc).__name__
    http = HTTP_BY_GRPC.get(code, INTERNAL)
    if http is INTERNAL and code != grpc.StatusCode.INTERNAL:  # a worker's names its own id
        message = internal_error_message(exc, "router")
    field = exc.field if isinstance(exc, RequestError) else None
    return ErrorBody(http.status, message, http.type, http.code, field)


def _invalid_body(exc: pydantic.ValidationError) -> ErrorBody:
    """The first problem, named by its field's path (``messages.0.content``)."""
    first = exc.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return ErrorBody(400, f"the body is not valid JSON: {first['ctx']['error']}",
                         "invalid_request_error", "invalid_json")
    path = ".".join(str(part) for part in first["loc"])
    message = f"{path}: {first['msg']}" if path else f"body: {first['msg']}"
    return ErrorBody(400, message, "invalid_request_error", None, path or None)
