"""The members of a local cluster and their command lines, derived from a ClusterSpec (pure:
nothing is started here)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from cluster.spec import ClusterSpec
from cluster.stores import STORE_SERVERS, StoreAccess

# service kind -> the gRPC service its health check names
SERVICE_NAMES = {"prefill": "snapstream.v1.Prefill", "decode": "snapstream.v1.Decode",
                 "router": "snapstream.v1.Generation"}


@dataclass(frozen=True)
class Member:
    """One process of the cluster. ``address`` is ``host:port`` for a gRPC service and the store
    URL for the store; ``service`` is the gRPC service name (None for the store, which is ready
    once it accepts connections)."""

    name: str
    argv: tuple[str, ...]
    address: str
    port: int
    service: str | None = None
    metrics_port: int | None = None
    env: tuple[tuple[str, str], ...] = ()  # set on top of the cluster's environment
    files: tuple[tuple[Path, str], ...] = ()  # written (mode 0600) before each start
    http_port: int | None = None  # the router's OpenAI API


def plan_cluster(spec: ClusterSpec, store_dir: Path, free_port: Callable[[], int],
                 access: StoreAccess, api_keys_file: Path | None = None,
                 secret_file: Path | None = None) -> tuple[tuple[Member, ...], ...]:
    """Stages in start order: the store; the prefill and decode workers; the router. Members of
    a stage start together; stopping runs the stages backwards. Ports given as 0 in ``spec``
    come from ``free_port()``. The store requires ``access``'s password (and TLS with its
    certificates); the workers get its URL in their environment, not on their command line.
    With ``access.certs``, every service serves TLS with them too (mutual between services);
    with ``api_keys_file``, the router asks its clients for a key of that file; with
    ``secret_file``, the workers seal and check blobs with the cluster secret it holds."""

    def port(requested: int) -> int:
        return requested or free_port()

    store = STORE_SERVERS[spec.store]
    store_port = port(spec.store_port)
    store_url = store.url(spec.host, store_port, access, spec.store_max_bytes)
    config = store_dir / store.config_name
    store_member = Member("store", store.argv(config), store_url, store_port,
                          files=((config, store.config(spec.host, store_port, store_dir,
                                                       access, spec.store_max_bytes)),))
    model = ("--model", str(spec.model)) if spec.model is not None else ()
    kv = ("--kv-dtype", spec.kv_dtype) if spec.kv_dtype is not None else ()
    tls = access.certs.flags() if access.certs is not None else ()
    store_env = (("SNAPSTREAM_STORE", store_url),
                 *((("SNAPSTREAM_CLUSTER_SECRET_FILE", str(secret_file)),)
                   if secret_file is not None else ()))
    draft = ("--draft-model", str(spec.draft_model)) if spec.draft_model is not None else ()
    prefill = _service(spec, "prefill", "prefill", port(spec.prefill_port), free_port(),
                       (*model, *kv, *draft, *tls), store_env)
    decode_ports = spec.decode_ports or (0,) * spec.decode_workers
    decodes = tuple(
        _service(spec, f"decode-{i}", "decode", port(requested), free_port(),
                 (*model, *kv, *tls, "--rows", str(spec.rows), "--backend", spec.backend),
                 store_env)
        for i, requested in enumerate(decode_ports))
    http_port = port(spec.http_port)
    keys = ("--api-keys-file", str(api_keys_file)) if api_keys_file is not None else ()
    router = _service(spec, "router", "router", port(spec.router_port), free_port(),
                      (*model, *tls, *keys, "--http-port", str(http_port), "--prefill-addrs",
                       prefill.address, "--decode-addrs", ",".join(d.address for d in decodes)))
    return (store_member,), (prefill, *decodes), (replace(router, http_port=http_port),)


def _service(spec: ClusterSpec, name: str, kind: str, port: int, metrics_port: int,
             flags: tuple[str, ...], env: tuple[tuple[str, str], ...] = ()) -> Member:
    argv = (sys.executable, "-m", "cli.main", "serve", kind, "--host", spec.host,
            "--port", str(port), "--metrics-port", str(metrics_port),
            "--drain-timeout-s", str(spec.drain_timeout_s), *flags)
    # torch sizes its thread pool from OMP_NUM_THREADS, as in the Kubernetes deployments
    runs_model = kind in ("prefill", "decode") and spec.torch_threads
    threads = (("OMP_NUM_THREADS", str(spec.torch_threads)),) if runs_model else ()
    return Member(name, argv, f"{spec.host}:{port}", port, SERVICE_NAMES[kind], metrics_port,
                  (*threads, *env))
