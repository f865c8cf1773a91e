"""API keys of the public services: ``Authorization: Bearer KEY`` over HTTP, the same in the
``authorization`` gRPC metadata; each key names its tenant.

Keys come from a file (``--api-keys-file``: a line is ``NAME KEY``, the tenant's name then its
key, or a bare ``KEY``, its own tenant; ``#`` comments) or from the environment
(``SNAPSTREAM_API_KEYS``, comma-separated entries of the same form), never from a command line,
where ``ps`` would show them. A presented key is compared against every key in constant time
(HMAC-SHA256 digests with ``hmac.compare_digest``, no early exit), so the time taken says
nothing about how much of it matched. Health checks stay open, for probes and load balancers.
Without keys every request is the one tenant ``DEFAULT_TENANT``.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from serving.settings import add_setting

KEYS_ENV = "SNAPSTREAM_API_KEYS"
SCHEME = "bearer"
MIN_KEY_LENGTH = 16
OPEN_GRPC_PREFIX = "/grpc.health.v1.Health/"
DEFAULT_TENANT = "default"  # every request's tenant when the service asks for no key
TENANT_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def tenant_of_bare_key(key: str) -> str:
    """The tenant of a key given without a name: its own, named by a digest of it (stable
    across restarts, so its cached documents stay its own)."""
    return "key-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def parse_entry(entry: str) -> tuple[str, str]:
    """``NAME KEY`` or ``KEY`` -> (tenant, key); ValueError naming what is wrong."""
    parts = entry.split()
    if len(parts) == 1:
        return tenant_of_bare_key(parts[0]), parts[0]
    if len(parts) != 2:
        raise ValueError("api keys: an entry is 'NAME KEY' or 'KEY', got "
                         f"{len(parts)} words")
    name, key = parts
    if not TENANT_PATTERN.fullmatch(name):
        raise ValueError(f"api keys: tenant name {name!r} must be 1-64 characters of "
                         "A-Z a-z 0-9 _ . -")
    return name, key


@dataclass(frozen=True)
class ApiKeys:
    """Accepted keys, kept only as keyed digests (the salt is per process), each with its
    tenant."""

    digests: tuple[bytes, ...]
    tenants: tuple[str, ...]  # of each digest
    salt: bytes = field(repr=False)

    @classmethod
    def of(cls, entries: list[str]) -> ApiKeys:
        """``entries``: ``NAME KEY`` or bare ``KEY`` each (:func:`parse_entry`)."""
        if not entries:
            raise ValueError("api keys: none given (an empty file or variable)")
        pairs = [parse_entry(entry) for entry in entries]
        short = [i for i, (_, key) in enumerate(pairs) if len(key) < MIN_KEY_LENGTH]
        if short:
            raise ValueError(f"api keys: key {short[0] + 1} is shorter than {MIN_KEY_LENGTH} "
                             "characters; use a random one (python -c 'import secrets; "
                             "print(secrets.token_urlsafe(32))')")
        keys = [key for _, key in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("api keys: a key is listed twice; give each tenant its own keys")
        salt = secrets.token_bytes(32)
        return cls(tuple(_digest(salt, key) for key in keys),
                   tuple(tenant for tenant, _ in pairs), salt)

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant of ``authorization`` when it is ``Bearer KEY`` with one of the keys, else
        None (constant time: every key is compared)."""
        scheme, _, key = (authorization or "").partition(" ")
        presented = _digest(self.salt, key.strip())
        matched = -1
        for i, digest in enumerate(self.digests):
            is_match = hmac.compare_digest(presented, digest)
            matched = i if is_match else matched
        if matched < 0 or scheme.lower() != SCHEME:
            return None
        return self.tenants[matched]

    def accepts(self, authorization: str | None) -> bool:
        return self.tenant_of(authorization) is not None


def _digest(salt: bytes, key: str) -> bytes:
    return hmac.new(salt, key.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()


def add_api_key_settings(parser: argparse.ArgumentParser) -> None:
    add_setting(parser, "--api-keys-file", default=None,
                help=f"file of accepted API keys, one a line: 'NAME KEY' (the key of tenant "
                     f"NAME) or 'KEY' (its own tenant); or set {KEYS_ENV}='NAME KEY,KEY'; "
                     "with neither, the service asks for no key")


def api_keys_from_args(args: argparse.Namespace,
                       environ: Callable[[str], str | None] = os.environ.get
                       ) -> ApiKeys | None:
    """None when neither the file nor the variable is set; ValueError when they say nothing
    usable, or when both are set (one source of truth)."""
    text = environ(KEYS_ENV)
    if args.api_keys_file is not None and text is not None:
        raise ValueError(f"--api-keys-file and {KEYS_ENV} are both set: keep one")
    if args.api_keys_file is not None:
        path = Path(args.api_keys_file)
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"--api-keys-file: cannot read {path} ({exc.strerror})") from None
        return ApiKeys.of([line.strip() for line in lines
                           if line.strip() and not line.lstrip().startswith("#")])
    if text is not None:
        return ApiKeys.of([part.strip() for part in text.split(",") if part.strip()])
    return None


MISSING_KEY = "an API key is required: send the header 'authorization: Bearer KEY'"
WRONG_KEY = "the API key is not valid"


def refusal(authorization: str | None) -> str:
    """The message of a refused call: what was wrong with what came."""
    return WRONG_KEY if authorization else MISSING_KEY


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for a call without an accepted key, before its handler runs; the
    health service stays open."""

    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_GRPC_PREFIX):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        authorization = metadata.get("authorization")
        if self.keys.accepts(authorization):
            return handler
        return _refusing(handler, refusal(authorization))


HANDLER_KINDS = {"unary_unary": grpc.unary_unary_rpc_method_handler,
                 "unary_stream": grpc.unary_stream_rpc_method_handler,
                 "stream_unary": grpc.stream_unary_rpc_method_handler,
                 "stream_stream": grpc.stream_stream_rpc_method_handler}


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that aborts with UNAUTHENTICATED without
    reading the request."""

    async def refuse(request_or_iterator, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kind = next(name for name in HANDLER_KINDS if getattr(handler, name) is not None)
    return HANDLER_KINDS[kind](refuse, request_deserializer=None,
                               response_serializer=handler.response_serializer)
