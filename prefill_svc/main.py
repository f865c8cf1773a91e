"""`snapstream serve prefill`: a prefill worker."""

from __future__ import annotations

import argparse
import asyncio
import logging

from prefill_svc.prefix_store import PrefixStore, PrefixStoreConfig
from prefill_svc.service import PrefillServicer
from serving.server import ServerSpec, serve, wait_until_idle
from serving.server import run as run_service
from serving.settings import add_server_settings, add_setting, add_worker_settings
from serving.tls import TlsFiles, add_tls_settings, tls_from_args
from serving.worker import open_worker
from snapstream.engine import Engine
from snapstream.prefix_config import SCORES, STORES, DocumentCacheConfig
from snapstream.specprefill.selector import DraftSelector
from snapstream.v1 import prefill_pb2_grpc

log = logging.getLogger(__name__)


def register(parser: argparse.ArgumentParser) -> None:
    add_server_settings(parser, port=50052, metrics_port=9102)
    add_tls_settings(parser)
    add_worker_settings(parser)
    add_setting(parser, "--blob-ttl-s", type=float, default=300.0,
                help="a blob not consumed by then is dropped by the store")
    add_setting(parser, "--max-queue", type=int, default=16,
                help="requests waiting for the model before RESOURCE_EXHAUSTED")
    add_setting(parser, "--prefix-cache-ttl-s", type=float, default=3600.0,
                help="a stored document cache unused for this long is dropped by the store")
    add_setting(parser, "--prefix-cache-max-bytes", type=int, default=1 << 30,
                help="document caches this worker keeps in the store (least recently used "
                     "deleted first; a larger document is served without caching)")
    add_setting(parser, "--prefix-score", default=DocumentCacheConfig.score,
                choices=SCORES,
                help="under --prefix-store superset: how a reusable document's stored tokens "
                     "are chosen without the question (docs/accuracy.md, 'Compress once, ask "
                     "many')")
    add_setting(parser, "--prefix-superset", type=int, default=DocumentCacheConfig.superset,
                help="under --prefix-store superset: a stored document keeps this many picks "
                     "per pick of a request's policy (the question's SnapKV window chooses "
                     "among them)")
    add_setting(parser, "--prefix-store", default=DocumentCacheConfig.store, choices=STORES,
                help="'whole': a reusable document is stored whole (each question selects "
                     "among all of it); 'superset': a question-agnostic subset (a smaller "
                     "blob, fewer answers)")
    add_setting(parser, "--draft-model", default=None,
                help="a draft model for speculative prefill (a model name or path, any family "
                     "the engine loads); unset: requests asking for it are refused")


def run(args: argparse.Namespace) -> int:
    if args.blob_ttl_s <= 0 or args.max_queue < 0:
        raise ValueError("--blob-ttl-s must be > 0 and --max-queue >= 0")
    return run_service(_serve(args, tls_from_args(args)))


async def _serve(args: argparse.Namespace, tls: TlsFiles | None) -> None:
    worker = await open_worker(args)
    engine, store = worker.engine, worker.store
    prefixes = PrefixStore(store, worker.spec, PrefixStoreConfig(
        ttl_s=args.prefix_cache_ttl_s, max_bytes=args.prefix_cache_max_bytes,
        document=DocumentCacheConfig(args.prefix_score, args.prefix_superset,
                                     args.prefix_store)))
    draft = args.draft_model and Engine.from_pretrained(args.draft_model, dtype=args.dtype,
                                                        device=args.device)
    servicer = PrefillServicer(engine, store, worker.spec, args.blob_ttl_s, args.max_queue,
                               prefixes, DraftSelector(draft) if draft else None)

    async def warmup() -> None:
        for warm in (engine, draft) if draft else (engine,):
            seconds = await asyncio.to_thread(warm.warm_up_prefill)
            log.info("prefill warm-up of %s: %.2f s", warm.name, seconds)

    async def drain(timeout_s: float) -> None:
        await wait_until_idle(lambda: servicer.outstanding > 0, timeout_s)
        servicer.close()
        await store.close()

    server_spec = ServerSpec("prefill", args.host, args.port, args.metrics_port,
                             args.drain_timeout_s, ("snapstream.v1.Prefill",),
                             tls=tls, require_client_cert=True)
    await serve(server_spec, lambda s: prefill_pb2_grpc.add_PrefillServicer_to_server(servicer, s),
                warmup, drain)
