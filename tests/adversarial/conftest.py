"""The adversarial tier: what one client can learn about, cost or do to another, and what
someone with the store's password can plant, against real Redis and NATS servers and the
services over real sockets. Every test here is marked ``adversarial``.

The integration tier's server fixtures (``redis_url``, ``nats_url``, ``backend``, ...) are
shared; ``keyed_stack`` adds the router's API keys and the OpenAI API in front of them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from router.openai_api.app import create_app
from router.openai_api.server import HttpServer
from serving.auth import ApiKeys
from snapstream.engine import Engine
from tests.integration.conftest import (  # noqa: F401  (fixtures)
    backend,
    nats_url,
    redis_url,
    start_server,
    url,
)
from tests.integration.test_services import Stack, serving_stack
from tests.tiny_models import write_tiny_model

# tenant -> key, as `snapstream up --api-keys-file` reads them ('NAME KEY' lines)
KEYS = {"alice": "alice-key-0123456789abcdef", "bob": "bob-key-0123456789abcdef"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/adversarial/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.adversarial)


@dataclass
class Keyed:
    stack: Stack
    base_url: str  # the OpenAI API's, http://127.0.0.1:PORT/v1

    def client(self, tenant: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=KEYS[tenant], max_retries=0)

    @property
    def model(self) -> str:
        return self.stack.router.model.name


@contextlib.asynccontextmanager
async def keyed_stack(model_dir: Path, store_url: str, **options) -> AsyncIterator[Keyed]:
    """``serving_stack`` whose router asks for ``KEYS`` (a tenant each) on gRPC and on its
    OpenAI API."""
    keys = ApiKeys.of([f"{tenant} {key}" for tenant, key in KEYS.items()])
    async with serving_stack(model_dir, store_url, api_keys=keys, **options) as stack:
        server = HttpServer(create_app(stack.router, lambda: True, keys), "127.0.0.1", 0)
        await server.start()
        try:
            yield Keyed(stack, server.base_url)
        finally:
            await server.stop()


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """A tiny draft model for speculative prefill (another seed than the target)."""
    return Engine.from_pretrained(write_tiny_model(tmp_path_factory.mktemp("draft"), seed=9))
