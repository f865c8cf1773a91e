"""KV store servers the local cluster can start, looked up by kind in ``STORE_SERVERS``.

Each runs from a configuration file (mode 0600: it holds the password) that requires a
password, holds at most ``max_bytes`` (Redis: maxmemory without eviction; NATS: the blob
stream's own limit, which its URL carries to every service; a write past it is refused, and the
services answer with a retry hint) and, with the cluster's certificates, speaks only TLS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cluster.certs import ClusterCerts

NATS_USER = "snapstream"


@dataclass(frozen=True)
class StoreAccess:
    """Who may use the store: the password, and the certificates when it speaks TLS."""

    password: str
    certs: ClusterCerts | None = None

    def __post_init__(self) -> None:
        if not self.password.replace("-", "").replace("_", "").isalnum():
            raise ValueError("password must be made of A-Z a-z 0-9 _ - (it goes into a URL "
                             "and a configuration file)")


@dataclass(frozen=True)
class StoreServer:
    """How to run one kind of store server: ``argv(config_path)``, the text of its
    configuration file for (host, port, data directory, access, the most bytes it holds), and
    the URL the services get as their store (for host, port, access, the most bytes it
    holds)."""

    binary: str
    config_name: str
    flags: tuple[str, ...]  # before the configuration file
    config_flag: str | None  # that names the file ("": a positional argument)
    config: Callable[[str, int, Path, StoreAccess, int], str]
    url: Callable[[str, int, StoreAccess, int], str]

    def argv(self, config_path: Path) -> tuple[str, ...]:
        flag = (self.config_flag,) if self.config_flag else ()
        return (self.binary, *self.flags, *flag, str(config_path))


def _redis_config(host: str, port: int, data_dir: Path, access: StoreAccess,
                  max_bytes: int) -> str:
    # nothing is evicted: the document cache makes its own room (its ledger), and a request's
    # blob in flight must not vanish
    lines = [f"bind {host}", 'save ""', "appendonly no", f"dir {data_dir}",
             f"requirepass {access.password}", f"maxmemory {max_bytes}",
             "maxmemory-policy noeviction"]
    if access.certs is None:
        lines.append(f"port {port}")
    else:
        certs = access.certs
        lines += ["port 0", f"tls-port {port}", f"tls-cert-file {certs.cert}",
                  f"tls-key-file {certs.key}", f"tls-ca-cert-file {certs.ca}",
                  "tls-auth-clients no"]
    return "\n".join(lines) + "\n"


def _redis_url(host: str, port: int, access: StoreAccess, max_bytes: int) -> str:
    if access.certs is None:
        return f"redis://:{access.password}@{host}:{port}/0"
    return f"rediss://:{access.password}@{host}:{port}/0?tls_ca_file={access.certs.ca}"


def _nats_config(host: str, port: int, data_dir: Path, access: StoreAccess,
                 max_bytes: int) -> str:
    """(``max_bytes`` goes in the URL: the stream's limit, see :func:`_nats_url`.)"""
    lines = [f'listen: "{host}:{port}"', f'jetstream {{ store_dir: "{data_dir / "jetstream"}" }}',
             f'authorization {{ user: "{NATS_USER}", password: "{access.password}" }}']
    if access.certs is not None:
        lines.append(f'tls {{ cert_file: "{access.certs.cert}", key_file: "{access.certs.key}" }}')
    return "\n".join(lines) + "\n"


def _nats_url(host: str, port: int, access: StoreAccess, max_bytes: int) -> str:
    # the stream's limit (JetStream's max_file_store does not give back what a purge frees)
    if access.certs is None:
        return f"nats://{NATS_USER}:{access.password}@{host}:{port}?max_bytes={max_bytes}"
    return (f"tls://{NATS_USER}:{access.password}@{host}:{port}?max_bytes={max_bytes}"
            f"&tls_ca_file={access.certs.ca}")


STORE_SERVERS: dict[str, StoreServer] = {
    "redis": StoreServer("redis-server", "redis.conf", (), None, _redis_config, _redis_url),
    "nats": StoreServer("nats-server", "nats.conf", ("-js",), "-c", _nats_config, _nats_url),
}
