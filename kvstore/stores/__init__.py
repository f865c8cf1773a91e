"""Blob stores: one async interface, back ends chosen by URL scheme (see docs/kvstore.md).

Importing a back end registers it in STORES for open_store.
"""

from kvstore.stores.base import STORES, BlobStore, new_blob_key, open_store
from kvstore.stores.errors import (
    BlobNotFound,
    StoreCorrupted,
    StoreError,
    StoreFull,
    StoreUnavailable,
)
from kvstore.stores.nats_store import NatsBlobStore, NatsStoreConfig
from kvstore.stores.redis_store import RedisBlobStore, RedisStoreConfig

__all__ = [
    "STORES",
    "BlobNotFound",
    "BlobStore",
    "NatsBlobStore",
    "NatsStoreConfig",
    "RedisBlobStore",
    "RedisStoreConfig",
    "StoreCorrupted",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "new_blob_key",
    "open_store",
]
