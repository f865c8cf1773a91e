"""The Starlette app: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``,
``/health``. A generation endpoint parses its body (``schemas``), converts it into the native
request (``convert``) and hands it to the router's shared ``RequestFlow``; the events come back
as one JSON body or as server-sent events (``frames``). Every error is an OpenAI error object
(``errors``); a client that disconnects cancels its generation at once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router.flow import RequestFlow
from router.openai_api.auth import ApiKeyMiddleware, tenant_of_scope
from router.openai_api.convert import chat_request, completion_request
from router.openai_api.errors import ApiError
from router.openai_api.frames import CHAT, TEXT, Flavor, Framer
from router.openai_api.responses import GenerationResponse, error_response
from router.openai_api.schemas import ChatCompletionBody, CompletionBody, GenerationBody
from serving.auth import ApiKeys
from serving.errors import REQUEST_ID, new_request_id

MAX_BODY_BYTES = 4 * 2**20


@dataclass(frozen=True)
class Endpoint:
    """A generation endpoint: its body, its conversion into the native request, its framing."""

    schema: type[GenerationBody]
    convert: Callable
    flavor: Flavor


ENDPOINTS = {"/v1/chat/completions": Endpoint(ChatCompletionBody, chat_request, CHAT),
             "/v1/completions": Endpoint(CompletionBody, completion_request, TEXT)}


def create_app(generation: RequestFlow, is_ready: Callable[[], bool],
               api_keys: ApiKeys | None = None) -> Starlette:
    """``is_ready``: whether /health says 200 (else 503: starting or draining); ``api_keys``:
    the keys every path but /health asks for (None: none asked)."""
    api = OpenAIApi(generation, is_ready)
    routes = [Route(path, api.generate_endpoint(endpoint), methods=["POST"])
              for path, endpoint in ENDPOINTS.items()]
    routes += [Route("/v1/models", api.models), Route("/v1/models/{model_id:path}", api.model),
               Route("/health", api.health)]
    middleware = [] if api_keys is None else [Middleware(ApiKeyMiddleware, keys=api_keys)]
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={HTTPException: _http_exception})


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    """Unknown paths and methods, as OpenAI error objects."""
    return error_response(ApiError(exc.status_code, f"{request.method} {request.url.path}: "
                                   f"{exc.detail}"))


class OpenAIApi:
    def __init__(self, generation: RequestFlow, is_ready: Callable[[], bool]) -> None:
        self.generation, self.is_ready = generation, is_ready
        self.model_id = generation.model.name

    def generate_endpoint(self, endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            request_id = new_request_id()
            REQUEST_ID.set(request_id)  # this task's: an internal error's answer names it
            try:
                body = endpoint.schema.model_validate_json(await _read_body(request))
                self._check_model(body.model)
                native = endpoint.convert(body)
            except ClientDisconnect:
                return Response(status_code=499)  # nobody reads it
            except Exception as exc:
                return error_response(exc)
            framer = Framer.new(endpoint.flavor, self.model_id,
                                self.generation.decode.model_fingerprint(),
                                body.options.return_token_ids)
            events = self.generation.generate(native, api="openai", request_id=request_id,
                                              tenant=tenant_of_scope(request.scope))
            return GenerationResponse(events, framer, body.stream, body.include_usage)

        return handle

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        try:
            self._check_model(request.path_params["model_id"])
        except ApiError as exc:
            return error_response(exc)
        return JSONResponse(self._model_card())

    async def health(self, request: Request) -> Response:
        if self.is_ready():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503)

    def _model_card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": 0, "owned_by": "snapstream",
                "max_model_len": self.generation.model.context_len}

    def _check_model(self, name: str) -> None:
        if name != self.model_id:
            raise ApiError(404, f"model {name!r} is not served here; this server serves "
                           f"{self.model_id!r} (GET /v1/models)", code="model_not_found",
                           param="model")


async def _read_body(request: Request) -> bytes:
    """The body, or 413 past MAX_BODY_BYTES (declared or sent)."""
    declared = request.headers.get("content-length", "")
    too_large = ApiError(413, f"the body is larger than {MAX_BODY_BYTES} bytes",
                         code="request_too_large")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)
