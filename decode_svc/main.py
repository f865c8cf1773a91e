"""`snapstream serve decode`: a decode worker."""

from __future__ import annotations

import argparse
import asyncio

from decode_svc.backends import BackendConfig, make_backend
from decode_svc.loop import DecodeLoop
from decode_svc.service import DecodeServicer
from serving.metrics import report_memory
from serving.server import ServerSpec, serve, wait_until_idle
from serving.server import run as run_service
from serving.settings import add_server_settings, add_setting, add_worker_settings
from serving.tls import TlsFiles, add_tls_settings, tls_from_args
from serving.worker import open_worker
from snapstream.memory_plan import decode_memory, memory_limit
from snapstream.policy import CachePolicy
from snapstream.v1 import decode_pb2_grpc


def register(parser: argparse.ArgumentParser) -> None:
    add_server_settings(parser, port=50053, metrics_port=9103)
    add_tls_settings(parser)
    add_worker_settings(parser)
    add_setting(parser, "--rows", type=int, default=8, help="rows of the static decode batch")
    add_setting(parser, "--max-queue", type=int, default=64, help="waiting requests before "
                "RESOURCE_EXHAUSTED")
    add_setting(parser, "--backend", default="torch", help="torch or sn40l-sim")
    add_setting(parser, "--sim-target", default=None,
                help="sn40l-sim: hwsim target name or config.json (default: the served model)")
    add_setting(parser, "--sim-sockets", type=int, default=1, help="sn40l-sim: sockets")


def run(args: argparse.Namespace) -> int:
    if args.rows < 1 or args.max_queue < 0:
        raise ValueError("--rows must be >= 1 and --max-queue >= 0")
    return run_service(_serve(args, tls_from_args(args)))


async def _serve(args: argparse.Namespace, tls: TlsFiles | None) -> None:
    worker = await open_worker(args)
    engine, store = worker.engine, worker.store
    backend = make_backend(BackendConfig(args.backend, args.sim_target, args.sim_sockets),
                           engine.config)
    memory = decode_memory(engine, memory_limit(args.memory_limit))
    report_memory(memory.report())
    loop = DecodeLoop(engine, backend, rows=args.rows, max_queue=args.max_queue, memory=memory)
    servicer = DecodeServicer(loop, store, worker.spec, worker.secret)

    async def warmup() -> None:
        loop.start()
        await asyncio.to_thread(_warm, engine)

    async def drain(timeout_s: float) -> None:
        servicer.start_draining()
        await wait_until_idle(lambda: _busy(loop), timeout_s)
        loop.stop()
        await store.close()

    server_spec = ServerSpec("decode", args.host, args.port, args.metrics_port,
                             args.drain_timeout_s, ("snapstream.v1.Decode",),
                             tls=tls, require_client_cert=True)
    await serve(server_spec, lambda s: decode_pb2_grpc.add_DecodeServicer_to_server(servicer, s),
                warmup, drain)


def _busy(loop) -> bool:
    stats = loop.stats()
    return bool(stats.running or stats.queue_depth)


def _warm(engine) -> None:
    """One prefill + decode step so the first request does not pay for lazy initialisation."""
    engine.generate([1, 2, 3], max_new_tokens=2, policy=CachePolicy(kind="full"))
