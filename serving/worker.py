"""What both model workers (prefill and decode) start from: the engine, the shape of its blobs,
the cluster secret that seals them, and the KV store. The one place that ties the engine to the
blob codec."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvstore import BlobStore, open_store
from kvstore.codec import BlobSpec
from kvstore.seal import ClusterSecret
from serving.metrics import report_machine
from serving.server import StartupError
from snapstream.engine import Engine
from snapstream.machine import this_machine

SECRET_ENV = "SNAPSTREAM_CLUSTER_SECRET"


def blob_spec(engine: Engine) -> BlobSpec:
    """What blobs of ``engine``'s model look like, in the engine's KV dtype."""
    return BlobSpec.for_model(engine.config, engine.fingerprint, engine.kv_dtype)


def cluster_secret(secret_file: str | None,
                   environ: Callable[[str], str | None] = os.environ.get) -> ClusterSecret:
    """The secret of ``--cluster-secret-file`` or ``SNAPSTREAM_CLUSTER_SECRET`` (one of them);
    StartupError saying what to set when neither gives a usable one."""
    text = environ(SECRET_ENV)
    if secret_file is not None and text is not None:
        raise StartupError(f"--cluster-secret-file and {SECRET_ENV} are both set: keep one")
    if secret_file is not None:
        try:
            text = Path(secret_file).read_text()
        except OSError as exc:
            raise StartupError(f"--cluster-secret-file: cannot read {secret_file} "
                               f"({exc.strerror})") from None
    if text is None:
        raise StartupError(f"no cluster secret: give every prefill and decode worker the same "
                           f"--cluster-secret-file or {SECRET_ENV} (it keys the MAC of every "
                           "blob; snapstream up makes one)")
    try:
        return ClusterSecret.of_text(text)
    except ValueError as exc:
        raise StartupError(str(exc)) from None


@dataclass(frozen=True)
class WorkerResources:
    engine: Engine
    spec: BlobSpec
    store: BlobStore
    secret: ClusterSecret


async def open_worker(args: argparse.Namespace) -> WorkerResources:
    """The cluster secret (checked first), the engine of ``--model``/``--dtype``/
    ``--kv-dtype``/``--device`` and the store at ``--store``
    (:func:`serving.settings.add_worker_settings`)."""
    secret = cluster_secret(args.cluster_secret_file)
    engine = Engine.from_pretrained(args.model, dtype=args.dtype, device=args.device,
                                    kv_dtype=args.kv_dtype)
    report_machine(this_machine().labels())
    try:
        store = await open_store(args.store)
    except ValueError as exc:  # a URL or a store configuration it cannot serve
        raise StartupError(f"--store: {exc}") from None
    return WorkerResources(engine, blob_spec(engine), store, secret)
