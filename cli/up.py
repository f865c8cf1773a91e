"""`snapstream up`: the whole cluster as local processes (KV store server, one prefill worker,
decode workers, router) until Ctrl-C or SIGTERM, restarting a member that exits; ``--demo``
streams a long-context passkey request through the client SDK once every service is healthy."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cli.demo import QUESTION, demo_prompt, run_demo
from cluster import STORE_SERVERS, ClusterError, ClusterSpec, LocalCluster
from kvstore.stores.base import redact_url
from snapstream.checkpoints.registry import DRAFT_HELP, MODEL_HELP, draft_name, model_path
from snapstream.client import SnapstreamError
from snapstream.weight_formats import KV_DTYPE_HELP, KV_DTYPES

WATCH_INTERVAL_S = 1.0
DEMO_TIMEOUT_S = 300.0


class Interrupted(Exception):
    """SIGINT or SIGTERM asked the cluster to stop."""


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", choices=tuple(STORE_SERVERS), default="redis",
                        help="KV store server to start")
    parser.add_argument("--model", default=None, help=MODEL_HELP)
    parser.add_argument("--draft-model", default=None,
                        help=f"the prefill worker's {DRAFT_HELP}")
    parser.add_argument("--kv-dtype", default=None, choices=KV_DTYPES,
                        help=f"the model workers' KV cache: {KV_DTYPE_HELP}")
    parser.add_argument("--host", default="127.0.0.1", help="address every service listens on")
    parser.add_argument("--port", type=int, default=50051, help="router port (0: a free port)")
    parser.add_argument("--http-port", type=int, default=8000,
                        help="port of the router's OpenAI-compatible HTTP API (0: a free port)")
    parser.add_argument("--decode-workers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=8, help="rows of each decode worker's batch")
    parser.add_argument("--backend", default="torch", help="decode back end: torch or sn40l-sim")
    parser.add_argument("--torch-threads", type=int, default=ClusterSpec.torch_threads,
                        help="torch threads of each prefill/decode worker (0: torch's default)")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="where each service logs (default: a new temporary directory, removed "
                             "when the cluster stops cleanly, kept after a fault)")
    parser.add_argument("--tls", action="store_true",
                        help="make a local CA and certificate (in LOG_DIR/tls); the KV store "
                             "(its chunk paths included), the services (mutual TLS between "
                             "them) and the OpenAI API (https) then speak only TLS")
    parser.add_argument("--api-key", action="store_true",
                        help="make an API key (in LOG_DIR/api-key) that the router asks every "
                             "gRPC and HTTP client for (health checks stay open)")
    parser.add_argument("--api-keys-file", type=Path, default=None,
                        help="the router asks for the keys of this file instead: a line is "
                             "'NAME KEY' (the key of tenant NAME; each tenant has its own "
                             "document cache and quotas) or a bare 'KEY'")
    parser.add_argument("--store-max-bytes", type=int, default=ClusterSpec.store_max_bytes,
                        help="the most the KV store server holds (Redis maxmemory, JetStream "
                             "max_file_store); past it, writes are refused and requests told "
                             "to retry")
    parser.add_argument("--start-timeout-s", type=float, default=180.0)
    parser.add_argument("--demo", action="store_true",
                        help="once the cluster is up, ask a question about a long document "
                        "with the cache at 1/4 of the prompt (cli/demo.py)")
    parser.add_argument("--exit-after-demo", action="store_true",
                        help="stop the cluster after the demo instead of waiting for Ctrl-C")


def run(args: argparse.Namespace) -> int:
    if args.exit_after_demo and not args.demo:
        raise ValueError("--exit-after-demo needs --demo")
    if args.demo and (args.tls or args.api_key or args.api_keys_file):
        raise ValueError("--demo speaks plaintext without a key: leave out --tls, --api-key "
                         "and --api-keys-file")
    if args.api_keys_file is not None and not args.api_keys_file.is_file():
        raise ValueError(f"--api-keys-file {args.api_keys_file}: no such file")

    model = model_path(args.model)  # fails fast, in one line, when not installed
    draft_model = draft_name(args.draft_model, args.model)
    draft = model_path(draft_model) if draft_model else None
    spec = ClusterSpec(store=args.store, model=model, draft_model=draft,
                       kv_dtype=args.kv_dtype, host=args.host,
                       router_port=args.port,
                       http_port=args.http_port, decode_workers=args.decode_workers,
                       rows=args.rows,
                       backend=args.backend, torch_threads=args.torch_threads,
                       log_dir=args.log_dir, tls=args.tls, api_key=args.api_key,
                       api_keys_file=args.api_keys_file, store_max_bytes=args.store_max_bytes,
                       start_timeout_s=args.start_timeout_s)
    cluster = LocalCluster(spec)
    with _signals_raise_interrupted():
        try:
            print(f"starting the cluster ({args.store} store) ...", file=sys.stderr, flush=True)
            cluster.start()
            _print_endpoints(cluster)
            if args.demo:
                _demo(cluster.endpoints["router"], model, args.kv_dtype)
            return 0 if args.exit_after_demo else _watch(cluster)
        except ClusterError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except SnapstreamError as exc:
            print(f"error: the demo request failed: {exc}", file=sys.stderr)
            return 1
        except Interrupted as exc:
            print(f"{exc}: stopping the cluster", file=sys.stderr, flush=True)
            return 0
        finally:
            _ignore_signals()  # a second Ctrl-C must not cut the shutdown short
            cluster.stop()
            kept = f"; logs in {cluster.log_dir}" if cluster.logs_kept else ""
            print(f"cluster stopped{kept}", file=sys.stderr, flush=True)


@contextmanager
def _signals_raise_interrupted() -> Iterator[None]:
    def interrupt(signum: int, frame: object) -> None:
        _ignore_signals()
        raise Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _ignore_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _print_endpoints(cluster: LocalCluster) -> None:
    """Every member's address (the store's without its password, which is in its
    configuration file) and metrics URL; worker and metrics ports are free ones picked at
    start."""
    metrics = cluster.metrics
    print(f"snapstream cluster is up; logs in {cluster.log_dir}")
    for name, address in cluster.endpoints.items():
        extra = f"metrics {metrics[name]}" if name in metrics else ""
        if name == "store":
            address = redact_url(address.split("?")[0])
            extra = f"password in {cluster.store_config}"
        print(f"  {name:<9} {address:<28}  {extra}".rstrip())
    print(f"  {'openai':<9} {cluster.openai_url}")
    if cluster.ca_file is not None:
        print(f"  TLS       CA {cluster.ca_file} (SDK: TlsConfig(root_certificates=CA); "
              "curl --cacert CA)")
    if cluster.spec.api_keys_file is not None:
        print(f"  API keys  of {cluster.api_key_file}, a tenant each; HTTP: Authorization: "
              "Bearer KEY")
    elif cluster.api_key_file is not None:
        print(f"  API key   in {cluster.api_key_file}: export SNAPSTREAM_API_KEY=$(cat "
              f"{cluster.api_key_file}) for the SDK and CLI; HTTP: Authorization: Bearer KEY")
    print(flush=True)


def _watch(cluster: LocalCluster) -> int:
    """Waits for a signal. A member that exits is started again after its backoff while the
    others keep serving; one that keeps exiting at once stops the cluster (ClusterError)."""
    print("cluster running; a member that exits is restarted; Ctrl-C or SIGTERM stops it",
          file=sys.stderr, flush=True)
    while True:
        for news in cluster.restart_exited():
            print(news, file=sys.stderr, flush=True)
        time.sleep(WATCH_INTERVAL_S)


def _demo(router_address: str, model: Path, kv_dtype: str | None) -> None:
    print(f"demo: a {len(demo_prompt())}-character document (the statistics module's "
          f"documentation) with a fact in its middle; the question at its end: {QUESTION!r}",
          flush=True)
    report = run_demo(router_address, str(model), kv_dtype, DEMO_TIMEOUT_S)
    for line in report.lines():
        print(f"demo: {line}", flush=True)
