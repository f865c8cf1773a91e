"""KV store servers the local cluster can start, looked up by kind in ``STORE_SERVERS``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StoreServer:
    """How to run one kind of store server: ``arguments(host, port, data_dir)`` follow the
    binary; ``url`` is what services get as ``--store``."""

    binary: str
    arguments: Callable[[str, int, Path], list[str]]
    url_template: str  # formatted with host and port

    def url(self, host: str, port: int) -> str:
        return self.url_template.format(host=host, port=port)


STORE_SERVERS: dict[str, StoreServer] = {
    "redis": StoreServer(
        "redis-server",
        lambda host, port, data_dir: ["--port", str(port), "--bind", host, "--save", "",
                                      "--appendonly", "no", "--dir", str(data_dir)],
        "redis://{host}:{port}/0"),
    "nats": StoreServer(
        "nats-server",
        lambda host, port, data_dir: ["-js", "-a", host, "-p", str(port),
                                      "-sd", str(data_dir / "jetstream")],
        "nats://{host}:{port}"),
}
