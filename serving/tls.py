"""TLS of the services: one certificate per service, one CA for the cluster.

A service given ``--tls-cert``/``--tls-key`` serves TLS with them and, for the calls it makes to
other services, presents them as its client certificate; ``--tls-ca`` is the CA it checks its
peers against: the servers it calls, and, on an internal service (prefill, decode), the clients
that call it (mutual TLS: a client without a certificate of that CA is refused in the
handshake). ``--tls-server-name`` is the name the servers' certificates are checked against
when they are called by IP (Kubernetes pod addresses), e.g. ``snapstream-internal``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import grpc

from serving.settings import add_setting
from snapstream.client.tls import TlsConfig


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        for name in ("cert", "key", "ca"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))
                if not Path(value).is_file():
                    raise ValueError(f"tls_{name}: {value} is not a file")
        if self.server_name == "":
            raise ValueError("tls_server_name must be a host name or unset")

    def server_credentials(self, require_client_cert: bool) -> grpc.ServerCredentials:
        """Serves with this certificate; with ``require_client_cert``, only clients whose
        certificate the CA signed complete the handshake."""
        if require_client_cert and self.ca is None:
            raise ValueError("tls_ca: an internal service needs the CA its callers' "
                             "certificates are checked against (mutual TLS)")
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.ca.read_bytes() if self.ca else None,
            require_client_auth=require_client_cert)

    def client(self) -> TlsConfig:
        """For calls to other services: checks them against the CA (and the server name),
        presents this certificate."""
        return TlsConfig(root_certificates=self.ca, certificate_chain=self.cert,
                         private_key=self.key, server_name_override=self.server_name)


def open_channel(address: str, tls: TlsFiles | None,
                 options: tuple[tuple[str, object], ...] = ()) -> grpc.aio.Channel:
    """An asyncio channel to another service: mutual TLS when ``tls`` is given, else plain."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    client = tls.client()
    return grpc.aio.secure_channel(address, client.credentials(),
                                   options=(*options, *client.channel_options()))


def add_tls_settings(parser: argparse.ArgumentParser) -> None:
    add_setting(parser, "--tls-cert", default=None,
                help="PEM certificate of this service (TLS on its gRPC port; its client "
                     "certificate towards other services)")
    add_setting(parser, "--tls-key", default=None, help="PEM private key of --tls-cert")
    add_setting(parser, "--tls-ca", default=None,
                help="PEM CA that the peers' certificates are checked against")
    add_setting(parser, "--tls-server-name", default=None,
                help="name the called services' certificates must carry, when they are "
                     "called by IP")


def tls_from_args(args: argparse.Namespace) -> TlsFiles | None:
    """None when no TLS flag is set; ValueError naming the flag when they do not add up."""
    given = {name: getattr(args, f"tls_{name}") for name in ("cert", "key", "ca", "server_name")}
    if not any(given.values()):
        return None
    if not (given["cert"] and given["key"]):
        raise ValueError("--tls-cert and --tls-key must be given together (with --tls-ca "
                         "for mutual TLS)")
    return TlsFiles(**given)
