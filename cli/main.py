"""`snapstream` command line: a tree of subcommands, each naming the module that implements it.

A command's module is imported only when the command line chooses it (``snapstream --help``
imports none; ``snapstream bench kv`` imports ``bench.kv_cli`` alone), so a command module
imports what it needs at its top, torch included.

Adding a subcommand is one entry in :data:`COMMANDS`::

    "info": Command("cli.info", "what this installation holds: models, kernels, CPU features"),

where the module (here ``cli/info.py``) exposes ``register(parser)``, which adds its flags
(or its own subparsers, as ``snapstream models list|pull`` may), and ``run(args) -> int``, the
exit code. A group of subcommands that each have a module of their own is a :class:`Group`
entry whose ``commands`` hold such entries (``bench``, ``serve``); ``dest`` names the chosen
one's attribute in ``args``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Command:
    module: str  # exposes register(parser) and run(args) -> int
    help: str


@dataclass(frozen=True)
class Group:
    help: str
    dest: str  # the attribute of args that names the chosen subcommand
    commands: dict[str, Command | Group] = field(default_factory=dict)


COMMANDS: dict[str, Command | Group] = {
    "generate": Command("cli.generate", "generate text with the in-process engine"),
    "ask": Command("cli.ask", "ask a question about a folder of source files: the answer and "
                   "what it cost"),
    "chat": Command("cli.chat", "chat with the model (in process, or --addr a router)"),
    "sim": Command("hwsim.cli", "SN40L cost model: step time, throughput and memory per tier"),
    "bench": Group("benchmarks that write their figures to docs/", "benchmark", {
        "engine": Command("bench.engine_cli", "engine decode and prefill speed against "
                          "transformers"),
        "serve": Command("bench.serve_cli", "serving through the router against the in-process "
                         "engine, and KV blob transfer"),
        "peers": Command("bench.peers.cli", "peers (llama.cpp, OpenVINO GenAI, transformers, "
                         "kvpress) on the same CPU, model and tokens"),
        "faults": Command("bench.faults.cli", "the cluster under faults: worker kills, store "
                          "restarts, poison requests"),
        "quant": Command("bench.quant_cli", "weight formats (float32, gguf, int8, int4): decode, "
                         "prefill, RSS and parity"),
        "kernels": Command("bench.kernel_bench", "quantized matmul kernels against torch's, by "
                           "batch"),
        "kv": Command("bench.kv_cli", "KV bytes per sequence: snapstream's layer groups against "
                      "the full cache and llama.cpp's"),
        "kv-dtype": Command("bench.kv_dtype_bench", "the KV cache's dtypes against each other on "
                            "the served model"),
        "capacity": Command("bench.capacity_bench", "streams of long prompts one decode worker "
                            "holds within a memory budget"),
        "prefill": Command("bench.prefill_bench", "prefill time to first token in process"),
        "flat": Command("bench.flat_bench", "decode step time against context, the lengths "
                        "taking turns"),
        "specprefill": Command("bench.specprefill_bench", "speculative prefill's time to first "
                               "token against prefilling the whole prompt"),
    }),
    "health": Command("cli.health", "gRPC health check of a service: exit 0 when SERVING"),
    "up": Command("cli.up", "local cluster: KV store, router, prefill, 2 decode workers"),
    "serve": Group("run one service: router, prefill or decode", "service", {
        "router": Command("router.main", "public Generation service: validation, scheduling, "
                          "failover"),
        "prefill": Command("prefill_svc.main", "prefill worker: prompt -> SnapKV -> blob in the "
                           "KV store"),
        "decode": Command("decode_svc.main", "decode worker: continuous batching over a static "
                          "batch of rows"),
    }),
    "eval": Command("evaluation.cli", "retrieval accuracy per cache policy and budget"),
    "models": Command("cli.models", "the named models: list them, pull (install) one"),
    "info": Command("cli.info", "this machine: CPU features, the path each kernel takes, dtypes "
                    "and threads"),
}


class CliError(Exception):
    """A user mistake on the command line: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise CliError(f"{self.prog}: {message}")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Every subcommand is listed; only the one ``argv`` chooses has its module imported and
    its flags registered."""
    parser = _Parser(prog="snapstream", description="SnapStream fixed-size KV cache serving")
    _add_commands(parser, COMMANDS, "command", argv)
    return parser


def _add_commands(parser: argparse.ArgumentParser, commands: dict[str, Command | Group],
                  dest: str, argv: list[str]) -> None:
    """``commands`` as subparsers of ``parser``; ``argv``: the words after ``parser``'s own."""
    sub = parser.add_subparsers(dest=dest, required=True, parser_class=_Parser)
    chosen = next((i for i, word in enumerate(argv) if not word.startswith("-")), None)
    for name, entry in commands.items():
        child = sub.add_parser(name, help=entry.help, description=entry.help)
        if chosen is None or argv[chosen] != name:
            continue
        if isinstance(entry, Group):
            _add_commands(child, entry.commands, entry.dest, argv[chosen + 1:])
        else:
            module = importlib.import_module(entry.module)
            module.register(child)
            child.set_defaults(_run=module.run)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(argv).parse_args(argv)
        return int(args._run(args) or 0)
    except (CliError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
