"""`snapstream serve prefill`: a prefill worker."""

from __future__ import annotations

import argparse
import asyncio

from snapstream.serving.settings import (
    add_dtype_setting,
    add_model_setting,
    add_server_settings,
    add_setting,
)
from snapstream.serving.tls import TlsFiles, add_tls_settings, tls_from_args


def register(parser: argparse.ArgumentParser) -> None:
    add_server_settings(parser, port=50052, metrics_port=9102)
    add_tls_settings(parser)
    add_model_setting(parser)
    add_dtype_setting(parser)
    add_setting(parser, "--device", default="cpu")
    add_setting(parser, "--store", default="redis://127.0.0.1:6379/0", help="KV store URL")
    add_setting(parser, "--blob-ttl-s", type=float, default=300.0,
                help="a blob not consumed by then is dropped by the store")
    add_setting(parser, "--max-queue", type=int, default=16,
                help="requests waiting for the model before RESOURCE_EXHAUSTED")


def run(args: argparse.Namespace) -> int:
    from snapstream.serving.server import run as run_service

    if args.blob_ttl_s <= 0 or args.max_queue < 0:
        raise ValueError("--blob-ttl-s must be > 0 and --max-queue >= 0")
    return run_service(_serve(args, tls_from_args(args)))


async def _serve(args: argparse.Namespace, tls: TlsFiles | None) -> None:
    from kvstore import open_store
    from kvstore.codec import BlobSpec
    from prefill_svc.service import PrefillServicer
    from snapstream.engine import Engine
    from snapstream.policy import CachePolicy
    from snapstream.serving.server import ServerSpec, serve, wait_until_idle
    from snapstream.v1 import prefill_pb2_grpc

    engine = Engine.from_pretrained(args.model, dtype=args.dtype, device=args.device)
    spec = BlobSpec.for_engine(engine)
    store = await open_store(args.store)
    servicer = PrefillServicer(engine, store, spec, args.blob_ttl_s, args.max_queue)

    async def warmup() -> None:
        await asyncio.to_thread(engine.prefill, [1, 2, 3], CachePolicy(kind="full"), 1)

    async def drain(timeout_s: float) -> None:
        await wait_until_idle(lambda: servicer.outstanding > 0, timeout_s)
        servicer.close()
        await store.close()

    server_spec = ServerSpec("prefill", args.host, args.port, args.metrics_port,
                             args.drain_timeout_s, ("snapstream.v1.Prefill",),
                             tls=tls, require_client_cert=True)
    await serve(server_spec, lambda s: prefill_pb2_grpc.add_PrefillServicer_to_server(servicer, s),
                warmup, drain)
