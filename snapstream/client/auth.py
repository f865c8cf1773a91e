"""The API key a client presents: ``authorization: Bearer KEY`` in every call's metadata."""

from __future__ import annotations

import os

API_KEY_ENV = "SNAPSTREAM_API_KEY"
Metadata = tuple[tuple[str, str], ...]


def key_metadata(api_key: str | None) -> Metadata | None:
    """The metadata for ``api_key``, or for ``$SNAPSTREAM_API_KEY`` when it is None; None when
    neither gives a key (a router that asks for none)."""
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    if not key:
        return None
    if key != key.strip() or any(ord(c) < 0x21 or ord(c) > 0x7E for c in key):
        raise ValueError("api_key must be printable ASCII without spaces")
    return (("authorization", f"Bearer {key}"),)
