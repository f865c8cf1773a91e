"""`snapstream health --addr host:port [--service NAME]`: one gRPC health check.

The container healthcheck of every service (Docker has no native gRPC probe; Kubernetes does and
uses it instead). Prints one line and exits 0 when the service is SERVING, 1 otherwise (starting,
draining, unreachable, unknown service name).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cluster.health import health_statuses
from snapstream.client.tls import TlsConfig


def _address(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{text!r} is not host:port")
    return text


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--addr", type=_address, default="127.0.0.1:50051",
                        help="host:port of the service's gRPC port")
    parser.add_argument("--service", default="",
                        help="health service name, e.g. snapstream.v1.Decode ('' = the server)")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="deadline of the check")
    parser.add_argument("--tls-ca", type=Path, default=None,
                        help="check over TLS, trusting this PEM CA")
    parser.add_argument("--tls-cert", type=Path, default=None,
                        help="client certificate (PEM) for a service that requires one")
    parser.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    parser.add_argument("--tls-server-name", default=None,
                        help="name the server's certificate must carry, if not the host's")


def run(args: argparse.Namespace) -> int:
    tls = None
    if args.tls_ca or args.tls_cert:
        tls = TlsConfig(root_certificates=args.tls_ca, certificate_chain=args.tls_cert,
                        private_key=args.tls_key, server_name_override=args.tls_server_name)
    status = health_statuses(args.addr, (args.service,), args.timeout_s, tls)[args.service]
    print(f"{args.addr} {args.service or '(server)'}: {status}")
    return 0 if status == "SERVING" else 1
