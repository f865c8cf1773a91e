"""The errors a blob store raises (all derive from StoreError)."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of the errors a blob store raises."""


class BlobNotFound(StoreError):
    """No readable blob under the key: never written, expired, deleted, or lost some chunks."""

    def __init__(self, key: str, reason: str = "absent or expired") -> None:
        super().__init__(f"blob {key!r} not found ({reason})")
        self.key = key


class StoreCorrupted(StoreError):
    """The stored manifest or chunks do not add up to the blob that was put."""


class StoreUnavailable(StoreError):
    """The store server cannot be reached or refused to serve; the message names the URL."""


class StoreFull(StoreError):
    """The store refused a write for want of room (Redis maxmemory, JetStream's storage
    limit): nothing was kept; retry later."""
