"""When a generation ends, and why: the one rule the engine, the decode worker and the router
apply to every new token (torch-free: the router imports it)."""

from __future__ import annotations

from collections.abc import Container

STOP_TOKEN = "stop_token"
LENGTH = "length"


def finish_reason(token: int, count: int, stop_ids: Container[int],
                  max_new_tokens: int) -> str | None:
    """Why a generation ends at ``token``, its ``count``-th new token (counting from 1):
    :data:`STOP_TOKEN` when ``token`` is one of ``stop_ids`` (the stop token is emitted, and is
    the last), else :data:`LENGTH` once ``count`` reaches ``max_new_tokens``; None while it goes
    on."""
    if token in stop_ids:
        return STOP_TOKEN
    if count >= max_new_tokens:
        return LENGTH
    return None
