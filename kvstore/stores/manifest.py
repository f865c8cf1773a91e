"""The manifest: what a reader needs to reassemble and check a blob, stored after its chunks."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from kvstore.stores.errors import StoreCorrupted

MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class Manifest:
    """What a reader needs to reassemble and check a blob; stored after its chunks."""

    size: int
    chunk_size: int
    crc32: int
    put_id: str  # names this put's chunks, so a put over an existing key never mixes chunks
    expires_at: float  # unix seconds, writer's clock

    def __post_init__(self) -> None:
        if self.size < 0 or self.chunk_size <= 0:
            raise ValueError(f"size {self.size} and chunk_size {self.chunk_size} out of range")

    @property
    def num_chunks(self) -> int:
        return -(-self.size // self.chunk_size)

    def chunk_sizes(self) -> list[int]:
        full, tail = divmod(self.size, self.chunk_size)
        return [self.chunk_size] * full + ([tail] if tail else [])

    def to_bytes(self) -> bytes:
        return json.dumps({"format": MANIFEST_FORMAT, **asdict(self)}).encode()

    @classmethod
    def from_bytes(cls, key: str, raw: bytes) -> Manifest:
        try:
            fields = json.loads(raw)
            version = fields.pop("format")
            manifest = cls(**fields)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StoreCorrupted(f"blob {key!r}: unreadable manifest ({exc})") from exc
        if version != MANIFEST_FORMAT:
            raise StoreCorrupted(f"blob {key!r}: manifest format {version}, "
                                f"this reader knows {MANIFEST_FORMAT}")
        return manifest

    @staticmethod
    def put_id_of(raw: bytes) -> str | None:
        """The put_id a stored manifest names (None when it is unreadable)."""
        try:
            return json.loads(raw).get("put_id")
        except (ValueError, AttributeError):
            return None
