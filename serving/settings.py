"""Every service setting is a CLI flag with a ``SNAPSTREAM_*`` environment twin.

``--decode-addrs`` reads ``SNAPSTREAM_DECODE_ADDRS`` when the flag is absent; flags win.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any

from snapstream.checkpoints.registry import MODEL_HELP
from snapstream.weight_formats import AUTO, DTYPE_CHOICES, DTYPE_HELP, KV_DTYPE_HELP, KV_DTYPES


def env_name(flag: str) -> str:
    return "SNAPSTREAM_" + flag.lstrip("-").replace("-", "_").upper()


def add_setting(parser: argparse.ArgumentParser, flag: str, *, type: Callable[[str], Any] = str,
                default: Any = None, help: str = "", choices: Sequence[Any] | None = None
                ) -> None:
    """Adds ``flag`` whose default comes from its environment twin when that is set."""
    env = env_name(flag)
    raw = os.environ.get(env)
    if raw is not None:
        try:
            default = type(raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{env}={raw!r} is not valid: {exc}") from None
        if choices is not None and default not in choices:
            raise ValueError(f"{env}={raw!r} is not valid: choose from {', '.join(choices)}")
    parser.add_argument(flag, type=type, default=default, choices=choices,
                        help=f"{help} (env {env})".strip())


def address_list(text: str) -> tuple[str, ...]:
    """``host:port,host:port`` -> tuple; each entry may be a DNS name resolving to many hosts."""
    addresses = tuple(part.strip() for part in text.split(",") if part.strip())
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"address {address!r} must be host:port")
    return addresses




def add_model_setting(parser: argparse.ArgumentParser) -> None:
    add_setting(parser, "--model", default=None, help=MODEL_HELP)


def add_dtype_setting(parser: argparse.ArgumentParser) -> None:
    """``--dtype`` (the weight format) and ``--kv-dtype`` (None: the format's KV dtype)."""
    add_setting(parser, "--dtype", default=AUTO, choices=DTYPE_CHOICES, help=DTYPE_HELP)
    add_setting(parser, "--kv-dtype", default=None, choices=KV_DTYPES, help=KV_DTYPE_HELP)


def add_worker_settings(parser: argparse.ArgumentParser) -> None:
    """The model and the store of a model worker (prefill, decode): see serving.worker."""
    add_model_setting(parser)
    add_dtype_setting(parser)
    add_setting(parser, "--device", default="cpu")
    add_setting(parser, "--store", default="redis://127.0.0.1:6379/0", help="KV store URL")
    add_setting(parser, "--cluster-secret-file", default=None,
                help="file holding the cluster secret that keys every blob's MAC, the same on "
                     "every prefill and decode worker (or set SNAPSTREAM_CLUSTER_SECRET)")
    add_setting(parser, "--memory-limit", default=None,
                help="the memory this worker may hold in all, e.g. 8GiB: work that would pass "
                     "it is refused (RESOURCE_EXHAUSTED) before it allocates; default: the "
                     "cgroup's limit, else what the machine has available at start")


def add_server_settings(parser: argparse.ArgumentParser, *, port: int, metrics_port: int) -> None:
    add_setting(parser, "--host", default="127.0.0.1",
                help="address to listen on (0.0.0.0: every interface)")
    add_setting(parser, "--port", type=int, default=port, help="gRPC port")
    add_setting(parser, "--metrics-port", type=int, default=metrics_port,
                help="Prometheus /metrics port (0 disables)")
    add_setting(parser, "--drain-timeout-s", type=float, default=30.0,
                help="on SIGTERM, how long running requests may finish")
