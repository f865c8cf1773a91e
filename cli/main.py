"""`snapstream` command line: one subcommand per module, looked up in a registry.

Each command module exposes ``register(parser)`` (adds its flags) and ``run(args) -> int``.
Modules keep heavy imports (torch, grpc) inside ``run`` so that ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("cli.generate", "generate text with the in-process engine"),
    "chat": ("cli.chat", "chat with the model (in process, or --addr a router)"),
    "sim": ("hwsim.cli", "SN40L cost model: step time, throughput and memory per tier"),
    "bench": ("cli.bench", "benchmarks that write their figures to docs/"),
    "health": ("cli.health", "gRPC health check of a service: exit 0 when SERVING"),
    "up": ("cli.up", "local cluster: KV store, router, prefill, 2 decode workers"),
    "serve": ("cli.serve", "run one service: router, prefill or decode"),
    "eval": ("evaluation.cli", "retrieval accuracy per cache policy and budget"),
}


class CliError(Exception):
    """A user mistake on the command line: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise CliError(f"{self.prog}: {message}")


def build_parser(selected: str | None) -> argparse.ArgumentParser:
    """All subcommands are listed; only the selected one's module is imported and registered."""
    parser = _Parser(prog="snapstream", description="SnapStream fixed-size KV cache serving")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (module_name, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if name == selected:
            module = importlib.import_module(module_name)
            module.register(command)
            command.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    selected = next((arg for arg in argv if not arg.startswith("-")), None)
    try:
        args = build_parser(selected).parse_args(argv)
        return int(args._run(args) or 0)
    except (CliError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
