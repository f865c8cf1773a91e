"""TLS settings of a client channel."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class TlsConfig:
    """PEM files for a TLS channel. ``root_certificates`` None trusts the roots gRPC ships with;
    ``certificate_chain`` and ``private_key`` (together) authenticate the client (mutual TLS);
    ``server_name_override`` is the name the server's certificate is checked against instead of
    the target's host (for addressing a server by IP, or in tests)."""

    root_certificates: Path | None = None
    certificate_chain: Path | None = None
    private_key: Path | None = None
    server_name_override: str | None = None

    def __post_init__(self) -> None:
        for name in ("root_certificates", "certificate_chain", "private_key"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError("certificate_chain and private_key must be given together "
                             "(mutual TLS) or not at all")
        if self.server_name_override == "":
            raise ValueError("server_name_override must be a host name or None")

    def credentials(self) -> grpc.ChannelCredentials:
        """Reads the PEM files (FileNotFoundError names a missing one)."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.root_certificates),
            private_key=_read(self.private_key),
            certificate_chain=_read(self.certificate_chain))

    def channel_options(self) -> tuple[tuple[str, str], ...]:
        if self.server_name_override is None:
            return ()
        return (("grpc.ssl_target_name_override", self.server_name_override),)


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None
