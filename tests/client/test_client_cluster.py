"""The client against the real system (router, prefill, decode, Redis) as processes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from snapstream.client import (
    AsyncSnapstreamClient,
    DeadlineExceeded,
    InvalidArgument,
    SnapstreamClient,
)
from snapstream.engine import Engine
from tests.tiny_models import tiny_snapstream_tokenizer

pytestmark = pytest.mark.slow
PROMPT = "The passkey is 4721. Remember it.\nWhat is the passkey?\nAnswer: "


def test_stream_chunks_add_up_to_generate(router_address: str) -> None:
    with SnapstreamClient(router_address, timeout_s=60) as client:
        stream = client.generate_stream(PROMPT, max_new_tokens=12, temperature=0.0)
        chunks = list(stream)
        completion = client.generate(PROMPT, max_new_tokens=12, temperature=0.0)
    assert "".join(chunk.text for chunk in chunks) == completion.text
    assert tuple(t for chunk in chunks for t in chunk.token_ids) == completion.token_ids
    assert stream.result().finish_reason == completion.finish_reason
    assert completion.completion_tokens == len(completion.token_ids) <= 12
    assert completion.prompt_tokens == len(tiny_snapstream_tokenizer().encode(PROMPT))
    assert completion.finish_reason in ("length", "stop_token")


def test_info_describes_the_served_model(router_address: str, cluster_model: Path) -> None:
    with SnapstreamClient(router_address, timeout_s=30) as client:
        info = client.info()
        while not info.model_fingerprint:  # known once the router has polled a decode worker
            time.sleep(0.1)
            info = client.info()
    assert info.vocab_size == 264 and info.context_length == 4096
    assert info.default_policy.kind == "snapstream"
    assert (info.default_policy.kernel, info.default_policy.observation) == (9, 16)  # the model's
    assert info.model_fingerprint == Engine.from_pretrained(cluster_model).fingerprint.hex()


def test_empty_prompt_is_invalid_argument_with_a_message(router_address: str) -> None:
    with SnapstreamClient(router_address, timeout_s=30) as client, \
            pytest.raises(InvalidArgument) as info:
        client.generate("")
    assert "prompt" in info.value.details


def test_tiny_timeout_is_deadline_exceeded(router_address: str) -> None:
    with SnapstreamClient(router_address) as client, pytest.raises(DeadlineExceeded):
        client.generate(PROMPT * 20, max_new_tokens=64, timeout_s=0.001)


async def test_async_client_streams_the_same_tokens(router_address: str) -> None:
    async with AsyncSnapstreamClient(router_address, timeout_s=60) as client:
        chunks = [c async for c in client.generate_stream(PROMPT, max_new_tokens=12,
                                                          temperature=0.0)]
        info = await client.info()
    with SnapstreamClient(router_address, timeout_s=60) as client:
        expected = client.generate(PROMPT, max_new_tokens=12, temperature=0.0)
    assert "".join(chunk.text for chunk in chunks) == expected.text
    assert info.vocab_size == 264
