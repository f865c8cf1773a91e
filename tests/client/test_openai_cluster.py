"""The official ``openai`` client against the router's OpenAI API in the real system (router,
prefill, decode, Redis as processes): the same greedy tokens as the native SDK over gRPC."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import openai
import pytest

from cluster import LocalCluster
from snapstream.client import SnapstreamClient

pytestmark = pytest.mark.slow
PROMPT = "The passkey is 4721. Remember it.\nWhat is the passkey?\nAnswer: "
MESSAGES = [{"role": "user", "content": "Hello!"}]
RETURN_TOKEN_IDS = {"snapstream": {"return_token_ids": True}}


def test_openai_client_gets_the_tokens_of_the_grpc_sdk(cluster: LocalCluster,
                                                        cluster_model: Path) -> None:
    with SnapstreamClient(cluster.endpoints["router"], timeout_s=60) as native:
        expected = native.generate(PROMPT, max_new_tokens=12, temperature=0.0)
        chat = native.chat(MESSAGES, max_new_tokens=12, temperature=0.0)
    with openai.OpenAI(base_url=cluster.openai_url, api_key="unused", max_retries=0,
                       timeout=60) as client:
        (model,) = [m.id for m in client.models.list().data]
        text = client.completions.create(model=model, prompt=PROMPT, max_tokens=12,
                                         temperature=0, extra_body=RETURN_TOKEN_IDS)
        stream = client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=12,
            temperature=0, stream=True, extra_body=RETURN_TOKEN_IDS)
        streamed = [c.choices[0] for c in stream if c.choices]
    assert model == cluster_model.name
    assert tuple(text.choices[0].model_extra["token_ids"]) == expected.token_ids
    assert text.choices[0].text == expected.text
    assert text.usage.completion_tokens == expected.completion_tokens
    assert tuple(t for c in streamed for t in c.model_extra.get("token_ids", ())) == chat.token_ids
    assert "".join(c.delta.content or "" for c in streamed) == chat.text


def test_health_answers_on_the_http_port(cluster: LocalCluster) -> None:
    health = cluster.openai_url.removesuffix("/v1") + "/health"
    with urllib.request.urlopen(health, timeout=10) as response:
        assert (response.status, response.read()) == (200, b'{"status":"ok"}')
