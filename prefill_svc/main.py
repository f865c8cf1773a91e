"""`snapstream serve prefill`: a prefill worker."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from kvstore import BlobStore
from kvstore.codec import BlobSpec
from prefill_svc.prefix_store import PrefixStore, PrefixStoreConfig
from prefill_svc.service import PrefillServicer
from serving.metrics import report_memory
from serving.server import ServerSpec, StartupError, serve, wait_until_idle
from serving.server import run as run_service
from serving.settings import add_server_settings, add_setting, add_worker_settings
from serving.tls import TlsFiles, add_tls_settings, tls_from_args
from serving.worker import open_worker
from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.registry import DRAFT_HELP, draft_name, model_path
from snapstream.engine import Engine
from snapstream.memory_plan import memory_limit, prefill_memory
from snapstream.prefix_config import SCORES, STORES, DocumentCacheConfig
from snapstream.specprefill.scoring import voting_layers
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
                help="document caches every prefill worker together keeps in the store, "
                     "counted in the store (a new document evicts the least recently used one "
                     "of the tenant holding the most; a larger document is served without "
                     "caching)")
    add_setting(parser, "--prefix-cache-tenant-max-bytes", type=int, default=None,
                help="document caches one tenant keeps in the store (a new one evicts the "
                     "tenant's own least recently used; default: --prefix-cache-max-bytes)")
    add_setting(parser, "--prefix-score", default=DocumentCacheConfig.score,
                choices=SCORES,
                help="under --prefix-store superset: how a reusable document's stored tokens "
                     "are chosen without the question (docs/accuracy.md, 'Compress once, ask "
                     "many')")
    add_setting(parser, "--prefix-superset", type=int, default=DocumentCacheConfig.superset,
                help="under --prefix-store superset: a stored document keeps this many picks "
                     "per pick of a request's policy (the question's SnapKV observation window "
                     "chooses "
                     "among them)")
    add_setting(parser, "--prefix-store", default=DocumentCacheConfig.store, choices=STORES,
                help="'whole': a reusable document is stored whole (each question selects "
                     "among all of it); 'superset': a question-agnostic subset (a smaller "
                     "blob, fewer answers)")
    add_setting(parser, "--draft-model", default=None,
                help=f"{DRAFT_HELP}; any family the engine loads; unset: requests asking for "
                     f"speculative prefill are refused")


def run(args: argparse.Namespace) -> int:
    if args.blob_ttl_s <= 0 or args.max_queue < 0:
        raise ValueError("--blob-ttl-s must be > 0 and --max-queue >= 0")
    return run_service(_serve(args, tls_from_args(args)))


async def _serve(args: argparse.Namespace, tls: TlsFiles | None) -> None:
    config = PrefixStoreConfig(
        ttl_s=args.prefix_cache_ttl_s, max_bytes=args.prefix_cache_max_bytes,
        tenant_max_bytes=args.prefix_cache_tenant_max_bytes,
        document=DocumentCacheConfig(args.prefix_score, args.prefix_superset,
                                     args.prefix_store))
    try:
        draft_model = draft_name(args.draft_model, args.model)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    draft_path = draft_model and _draft_path(draft_model)  # before the target loads
    worker = await open_worker(args)
    engine, store = worker.engine, worker.store
    try:
        await _check_store(store, worker.spec, engine, args.blob_ttl_s, config)
        draft = draft_path and _load_draft(draft_model, draft_path, args.dtype, args.device)
    except BaseException:
        await store.close()
        raise
    prefixes = PrefixStore(store, worker.spec, worker.secret, config)
    selector = DraftSelector(draft, draft_path) if draft else None
    servicer = PrefillServicer(engine, store, worker.spec, worker.secret, args.blob_ttl_s,
                               args.max_queue, prefixes, selector)

    limit = memory_limit(args.memory_limit)  # before the model's warm-up holds more

    async def warmup() -> None:
        for warm in (engine, draft) if draft else (engine,):
            seconds = await asyncio.to_thread(warm.warm_up_prefill)
            log.info("prefill warm-up of %s: %.2f s", warm.name, seconds)
        servicer.memory = prefill_memory(engine, limit)
        report_memory(servicer.memory.report())

    async def drain(timeout_s: float) -> None:
        await wait_until_idle(lambda: servicer.outstanding > 0, timeout_s)
        servicer.close()
        await store.close()

    server_spec = ServerSpec("prefill", args.host, args.port, args.metrics_port,
                             args.drain_timeout_s, ("snapstream.v1.Prefill",),
                             tls=tls, require_client_cert=True)
    await serve(server_spec, lambda s: prefill_pb2_grpc.add_PrefillServicer_to_server(servicer, s),
                warmup, drain)


def _draft_path(name: str) -> Path:
    """The draft's checkpoint, read as far as its config and tokenizer (not its weights), so
    that an unknown or unreadable one stops the worker at once, in one line."""
    path = model_path(name)
    try:
        open_checkpoint(path)
    except (OSError, ValueError) as exc:
        raise StartupError(f"--draft-model {name}: {exc}") from None
    return path


def _load_draft(name: str, path: Path, dtype: str, device: str) -> Engine:
    try:
        draft = Engine.from_pretrained(path, dtype=dtype, device=device)
        voting_layers(draft.config.attention_windows)  # it must have a global layer
    except (OSError, ValueError) as exc:
        raise StartupError(f"--draft-model {name}: cannot serve as a draft ({exc})") from None
    return draft


async def _check_store(store: BlobStore, spec: BlobSpec, engine: Engine, blob_ttl_s: float,
                       config: PrefixStoreConfig) -> None:
    """What the store cannot hold stops the worker now rather than fail each request: a TTL
    beyond its longest, or the document cache's cap and one request's blob beyond its
    memory."""
    limits = await store.limits()
    for flag, ttl_s in (("--blob-ttl-s", blob_ttl_s), ("--prefix-cache-ttl-s", config.ttl_s)):
        if limits.max_ttl_s is not None and ttl_s > limits.max_ttl_s:
            raise StartupError(f"{flag} {ttl_s:g} exceeds the longest TTL of the KV store "
                               f"{store.url} ({limits.max_ttl_s:g} s, its max_ttl_s): lower "
                               f"{flag} to at most {limits.max_ttl_s:g}")
    context = engine.context_len
    layout = spec.model_layout(engine.default_policy.layout(context - 1, 1, context))
    blob_bytes = spec.blob_size(layout)
    if limits.max_bytes is not None and config.max_bytes + blob_bytes > limits.max_bytes:
        raise StartupError(f"--prefix-cache-max-bytes {config.max_bytes} plus one request's "
                           f"blob ({blob_bytes} bytes) exceed the memory of the KV store "
                           f"{store.url} ({limits.max_bytes} bytes): lower "
                           "--prefix-cache-max-bytes or give the store more memory")
