"""`snapstream serve router`: the public Generation service."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

from router.flow import RequestFlow
from router.openai_api.app import create_app
from router.openai_api.server import HttpServer
from router.request import RequestLimits, ServedModel
from router.service import GenerationServicer
from router.tenants import TenantLimits
from router.workers import WorkerPool, poll_decode_stats
from serving.auth import ApiKeys, add_api_key_settings, api_keys_from_args
from serving.server import ServerSpec, serve, wait_until_idle
from serving.server import run as run_service
from serving.settings import (
    add_model_setting,
    add_server_settings,
    add_setting,
    address_list,
)
from serving.tls import TlsFiles, add_tls_settings, tls_from_args
from snapstream.checkpoints import open_checkpoint
from snapstream.policy import load_default_policy
from snapstream.v1 import decode_pb2_grpc, generation_pb2_grpc, prefill_pb2_grpc


def register(parser: argparse.ArgumentParser) -> None:
    add_server_settings(parser, port=50051, metrics_port=9101)
    add_tls_settings(parser)
    add_api_key_settings(parser)
    add_setting(parser, "--http-port", type=int, default=8000,
                help="port of the OpenAI-compatible HTTP API, on --host (0 disables it)")
    add_model_setting(parser)
    add_setting(parser, "--prefill-addrs", type=address_list, default=("127.0.0.1:50052",),
                help="prefill workers: host:port list; a DNS name may resolve to many")
    add_setting(parser, "--decode-addrs", type=address_list, default=("127.0.0.1:50053",),
                help="decode workers: host:port list; a DNS name may resolve to many")
    add_setting(parser, "--default-max-new-tokens", type=int, default=128)
    add_setting(parser, "--default-policy", default="snapstream",
                help="policy kind when a request leaves it unset")
    add_setting(parser, "--stats-interval-s", type=float, default=0.25,
                help="how often decode workers' free rows are polled")
    add_setting(parser, "--resolve-interval-s", type=float, default=10.0,
                help="how often worker DNS names are re-resolved")
    limits, tenants = RequestLimits(), TenantLimits()
    add_setting(parser, "--limit-max-new-tokens", type=int, default=limits.max_new_tokens,
                help="the most max_new_tokens (max_tokens) a request may ask for")
    add_setting(parser, "--limit-look-ahead", type=int, default=limits.look_ahead,
                help="the most speculative.look_ahead a request may ask for (draft decode "
                     "steps on the prefill worker's model thread)")
    add_setting(parser, "--limit-chunk-size", type=int, default=limits.chunk_size,
                help="the most speculative.chunk_size a request may ask for")
    add_setting(parser, "--tenant-max-running", type=int, default=tenants.max_running,
                help="requests a tenant (an API key's name) may have in flight")
    add_setting(parser, "--tenant-max-queued-tokens", type=int,
                default=tenants.max_queued_tokens,
                help="prompt tokens a tenant may have waiting for their prefill")


def run(args: argparse.Namespace) -> int:
    return run_service(_serve(args, Security(tls_from_args(args), api_keys_from_args(args))))


def load_served_model(path, default_policy: str, default_max_new_tokens: int,
                      limits: RequestLimits | None = None):
    """The router's view of the model: config, tokenizer, defaults and request limits, no
    weights."""
    checkpoint = open_checkpoint(path)
    config = checkpoint.config
    policy = replace(load_default_policy(checkpoint.policy_file), kind=default_policy)
    if policy.is_fixed_size and policy.budget > config.max_position_embeddings:
        policy = replace(policy, n_topk=config.max_position_embeddings // 4,
                         n_recent=config.max_position_embeddings // 8)
    if default_max_new_tokens < 1:
        raise ValueError("--default-max-new-tokens must be >= 1")
    return ServedModel(name=checkpoint.name, path=checkpoint.path, config=config,
                       tokenizer=checkpoint.tokenizer(), default_policy=policy,
                       default_max_new_tokens=default_max_new_tokens,
                       limits=limits or RequestLimits())


@dataclass(frozen=True)
class Security:
    """The router's public ports serve TLS with ``tls`` (no client certificate asked) and ask
    for one of ``api_keys``; its calls to the workers use mutual TLS with the same files."""

    tls: TlsFiles | None
    api_keys: ApiKeys | None


async def _serve(args: argparse.Namespace, security: Security) -> None:
    model = load_served_model(args.model, args.default_policy, args.default_max_new_tokens,
                              RequestLimits(args.limit_max_new_tokens, args.limit_look_ahead,
                                            args.limit_chunk_size))
    prefill = WorkerPool("prefill", args.prefill_addrs, prefill_pb2_grpc.PrefillStub,
                         "least_outstanding", security.tls)
    decode = WorkerPool("decode", args.decode_addrs, decode_pb2_grpc.DecodeStub,
                        "most_free_rows", security.tls)
    generation = RequestFlow(model, prefill, decode,
                             TenantLimits(args.tenant_max_running, args.tenant_max_queued_tokens))
    servicer = GenerationServicer(generation, security.api_keys)
    is_ready = asyncio.Event()

    def can_serve() -> bool:  # warm, not draining, and a worker of each kind connected
        return is_ready.is_set() and prefill.is_reachable() and decode.is_reachable()

    http = _http_server(args, security, generation, can_serve)
    poller: list[asyncio.Task] = []

    async def warmup() -> None:
        await prefill.refresh()
        await decode.refresh()
        poller.append(asyncio.create_task(
            poll_decode_stats(decode, args.stats_interval_s, args.resolve_interval_s)))
        if http is not None:
            await http.start()
            print(f"snapstream router OpenAI API on {http.base_url}", file=sys.stderr,
                  flush=True)
        is_ready.set()

    async def drain(timeout_s: float) -> None:
        is_ready.clear()  # HTTP /health says 503, as gRPC health says NOT_SERVING
        await wait_until_idle(lambda: generation.active > 0, timeout_s)
        if http is not None:
            await http.stop()
        for task in poller:
            task.cancel()
        await prefill.close()
        await decode.close()

    spec = ServerSpec("router", args.host, args.port, args.metrics_port, args.drain_timeout_s,
                      ("snapstream.v1.Generation",), reflection=True, tls=security.tls,
                      api_keys=security.api_keys)
    await serve(spec, lambda s: generation_pb2_grpc.add_GenerationServicer_to_server(servicer, s),
                warmup, drain, can_serve)


def _http_server(args: argparse.Namespace, security: Security, generation,
                 can_serve: Callable[[], bool]):
    """The OpenAI API's server (not yet listening), or None with ``--http-port 0``."""
    if not args.http_port:
        return None

    app = create_app(generation, can_serve, security.api_keys)
    return HttpServer(app, args.host, args.http_port, security.tls)
