"""`snapstream serve router|prefill|decode`: run one service (the container's entry point)."""

from __future__ import annotations

import argparse
import importlib

SERVICES: dict[str, tuple[str, str]] = {
    "router": ("router.main", "public Generation service: validation, scheduling, failover"),
    "prefill": ("prefill_svc.main", "prefill worker: prompt -> SnapKV -> blob in the KV store"),
    "decode": ("decode_svc.main", "decode worker: continuous batching over a static slot pool"),
}


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="service", required=True, parser_class=type(parser))
    for name, (module_name, help_text) in SERVICES.items():
        module = importlib.import_module(module_name)
        service = sub.add_parser(name, help=help_text, description=help_text)
        module.register(service)
        service.set_defaults(_serve=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args._serve(args) or 0)
