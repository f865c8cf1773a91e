"""API keys on the HTTP API: 401 with an OpenAI error object and ``WWW-Authenticate: Bearer``
for a request without an accepted ``Authorization: Bearer KEY``; ``/health`` stays open. An
accepted key's tenant goes in the request's scope (``tenant_of_scope``)."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from router.openai_api.errors import ApiError
from router.openai_api.responses import error_response
from serving.auth import DEFAULT_TENANT, ApiKeys, refusal

OPEN_PATHS = frozenset({"/health"})
TENANT_SCOPE_KEY = "snapstream.tenant"


def tenant_of_scope(scope: Scope) -> str:
    """The tenant of the request's key; the default tenant when the API asks for no key."""
    return scope.get(TENANT_SCOPE_KEY, DEFAULT_TENANT)


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: ApiKeys) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        authorization = Headers(scope=scope).get("authorization")
        tenant = self.keys.tenant_of(authorization)
        if tenant is not None:
            await self.app({**scope, TENANT_SCOPE_KEY: tenant}, receive, send)
            return
        # OpenAI's own 401: an invalid_request_error with code invalid_api_key
        response = error_response(ApiError(401, refusal(authorization), code="invalid_api_key"))
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)
