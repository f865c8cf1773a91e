"""bench peers --parts serve: what it asks of llama-server through the shared load generator."""

from __future__ import annotations

from dataclasses import replace

from bench.peers.serve import PeersServeConfig
from bench.serve_openai import OpenAIClient
from snapstream.policy import CachePolicy


def test_llama_server_is_told_not_to_reuse_a_cached_prompt():
    """Every round sends the same prompts: a slot's cached KV would skip their prefill."""
    cfg = PeersServeConfig(concurrency=(4,), requests=(8,)).serve_config("http://127.0.0.1:1/v1")
    assert cfg.openai_url == "http://127.0.0.1:1/v1" and cfg.systems == ("in-process", "openai")
    body = OpenAIClient(None, "m", replace(cfg, policy=CachePolicy())).extension
    assert body["cache_prompt"] is False
    assert body["snapstream"]["return_token_ids"] is True


def test_other_servers_get_only_the_snapstream_extension():
    cfg = PeersServeConfig().serve_config("http://127.0.0.1:1/v1")
    body = OpenAIClient(None, "m", replace(cfg, policy=CachePolicy(), openai_fields=())).extension
    assert set(body) == {"snapstream"}
