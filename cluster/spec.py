"""What a local cluster runs: ``ClusterSpec``, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cluster.restarts import RestartPolicy
from cluster.stores import STORE_SERVERS


@dataclass(frozen=True)
class ClusterSpec:
    """A KV store server, one prefill worker, ``decode_workers`` decode workers and the router,
    all on ``host``. A port of 0 (and empty ``decode_ports``) means a free port picked at start.
    ``model`` None serves the default model. ``log_dir`` None logs to a new temporary
    directory, removed by a clean stop and kept for reading after a fault (LocalCluster).
    ``backend`` is the decode workers' (torch or sn40l-sim; they validate it). On stop, each
    service may drain for ``drain_timeout_s`` after SIGTERM before it is killed."""

    store: str = "redis"
    model: Path | None = None
    draft_model: Path | None = None  # the prefill worker's, for speculative prefill
    kv_dtype: str | None = None  # the workers' --kv-dtype; None: their format's
    host: str = "127.0.0.1"
    router_port: int = 50051
    http_port: int = 0  # the router's OpenAI HTTP API (`snapstream up` asks for 8000)
    prefill_port: int = 0
    decode_ports: tuple[int, ...] = ()
    store_port: int = 0
    decode_workers: int = 2
    rows: int = 8  # of each decode worker's batch
    backend: str = "torch"
    torch_threads: int = 0  # OMP_NUM_THREADS of each prefill/decode worker; 0: inherit
    log_dir: Path | None = None
    start_timeout_s: float = 180.0
    drain_timeout_s: float = 10.0
    tls: bool = False  # the store and the services speak only TLS (mutual between services),
    # with a CA and certificate made at start in log_dir/tls
    api_key: bool = False  # the router asks for an API key, made at start in log_dir/api-key
    api_keys_file: Path | None = None  # or for the keys of this file ('NAME KEY' lines)
    store_max_bytes: int = 4 << 30  # the store server holds at most this much
    restarts: RestartPolicy = field(default_factory=RestartPolicy)  # see restart_exited

    def __post_init__(self) -> None:
        if self.store not in STORE_SERVERS:
            raise ValueError(f"store must be one of {', '.join(STORE_SERVERS)}, "
                             f"got {self.store!r}")
        for name in ("model", "draft_model", "log_dir", "api_keys_file"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        object.__setattr__(self, "decode_ports", tuple(self.decode_ports))
        if self.api_key and self.api_keys_file is not None:
            raise ValueError("api_key makes a key; api_keys_file gives the keys: keep one")
        if self.store_max_bytes < 1 << 20:
            raise ValueError(f"store_max_bytes must be at least 1 MiB, got "
                             f"{self.store_max_bytes}")
        if self.torch_threads < 0:
            raise ValueError(f"torch_threads must be >= 0, got {self.torch_threads}")
        if self.decode_workers < 1 or self.rows < 1:
            raise ValueError("decode_workers and rows must be >= 1, "
                             f"got {self.decode_workers} and {self.rows}")
        if self.decode_ports and len(self.decode_ports) != self.decode_workers:
            raise ValueError(f"decode_ports must be empty or hold decode_workers "
                             f"({self.decode_workers}) ports, got {self.decode_ports}")
        ports = (self.router_port, self.http_port, self.prefill_port, self.store_port,
                 *self.decode_ports)
        if any(not 0 <= port < 65536 for port in ports):
            raise ValueError(f"ports must lie in [0, 65535], got {ports}")
        if self.start_timeout_s <= 0 or self.drain_timeout_s <= 0:
            raise ValueError("start_timeout_s and drain_timeout_s must be > 0, "
                             f"got {self.start_timeout_s} and {self.drain_timeout_s}")
