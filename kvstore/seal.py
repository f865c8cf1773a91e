"""What binds a KV blob to its cluster, its place and its tokens: an HMAC-SHA256 under the
cluster secret over the store key and the whole blob, and the SHA-256 of the token ids the
cache was made from (torch-free).

Anyone who can write to the store (its password) can put bytes under a key; only the holders
of the cluster secret (the prefill and decode workers) can make bytes that pass the MAC, and
a blob moved to another key fails it too. The secret comes from ``--cluster-secret-file`` or
``SNAPSTREAM_CLUSTER_SECRET``; ``snapstream up``, compose and the Kubernetes manifests make one.
"""

from __future__ import annotations

import hashlib
import hmac
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

MAC_SIZE = 32  # HMAC-SHA256
DIGEST_SIZE = 32  # SHA-256 of the token ids
MIN_SECRET_BYTES = 16
_DOMAIN = b"snapstream-blob/1\0"


@dataclass(frozen=True)
class ClusterSecret:
    """The key of every blob's MAC; the same on every prefill and decode worker."""

    value: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.value) < MIN_SECRET_BYTES:
            raise ValueError(f"cluster secret: {len(self.value)} bytes, at least "
                             f"{MIN_SECRET_BYTES} needed; make one with python -c 'import "
                             "secrets; print(secrets.token_urlsafe(32))'")

    @classmethod
    def of_text(cls, text: str) -> ClusterSecret:
        return cls(text.strip().encode())

    def mac(self, key: str) -> hmac.HMAC:
        """A MAC of a blob stored under ``key``: feed it the blob's bytes."""
        mac = hmac.new(self.value, digestmod=hashlib.sha256)
        mac.update(_DOMAIN + key.encode() + b"\0")
        return mac


def tokens_digest(token_ids: Sequence[int]) -> bytes:
    """SHA-256 of token ids (uint32 each): what a blob says its cache was made from."""
    return hashlib.sha256(array("I", token_ids).tobytes()).digest()


NO_TOKENS = bytes(DIGEST_SIZE)  # a blob that names no tokens


@dataclass(frozen=True)
class Seal:
    """A blob's binding. Writing: ``tokens`` is the digest of the token ids its cache holds.
    Reading: the digest the reader expects, or None to check none (the MAC is always
    checked)."""

    secret: ClusterSecret
    key: str
    tokens: bytes | None = NO_TOKENS
