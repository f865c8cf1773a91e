"""What both model workers (prefill and decode) start from: the engine, the shape of its blobs,
and the KV store. The one place that ties the engine to the blob codec."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kvstore import BlobStore, open_store
from kvstore.codec import BlobSpec
from snapstream.engine import Engine


def blob_spec(engine: Engine) -> BlobSpec:
    """What blobs of ``engine``'s model look like, in the engine's KV dtype."""
    return BlobSpec.for_model(engine.config, engine.fingerprint, engine.kv_dtype)


@dataclass(frozen=True)
class WorkerResources:
    engine: Engine
    spec: BlobSpec
    store: BlobStore


async def open_worker(args: argparse.Namespace) -> WorkerResources:
    """The engine of ``--model``/``--dtype``/``--kv-dtype``/``--device`` and the store at
    ``--store`` (:func:`serving.settings.add_worker_settings`)."""
    engine = Engine.from_pretrained(args.model, dtype=args.dtype, device=args.device,
                                    kv_dtype=args.kv_dtype)
    return WorkerResources(engine, blob_spec(engine), await open_store(args.store))
