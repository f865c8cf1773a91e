"""The command registry: every entry names a module with register and run, and only the module
of the chosen command is imported (so ``snapstream --help`` imports none)."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import COMMANDS, Command, Group, main


def _leaves(commands: dict[str, Command | Group], path: tuple[str, ...] = ()):
    for name, entry in commands.items():
        if isinstance(entry, Group):
            yield from _leaves(entry.commands, (*path, name))
        else:
            yield (*path, name), entry


LEAVES = dict(_leaves(COMMANDS))


@pytest.mark.parametrize("words", list(LEAVES), ids=" ".join)
def test_every_command_module_defines_register_and_run(words):
    spec = importlib.util.find_spec(LEAVES[words].module)  # finds, does not import
    assert spec is not None and spec.origin, words
    tree = ast.parse(Path(spec.origin).read_text())
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {"register", "run"} <= defined, f"{spec.origin}: define register(parser) and run(args)"


def _imported_commands(argv: list[str]) -> list[str]:
    """The registered command modules a fresh interpreter has imported after ``main(argv)``."""
    code = (f"import json, sys\nfrom cli.main import main\ntry:\n    main({argv!r})\n"
            f"except SystemExit:\n    pass\n"
            f"print(json.dumps(sorted(sys.modules)))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    loaded = set(json.loads(run.stdout.splitlines()[-1]))
    return sorted(entry.module for entry in LEAVES.values() if entry.module in loaded)


def test_the_top_level_help_imports_no_command_module():
    assert _imported_commands(["--help"]) == []
    assert _imported_commands(["bench", "--help"]) == []


def test_a_chosen_command_imports_its_own_module_alone():
    assert _imported_commands(["bench", "kv", "--help"]) == ["bench.kv_cli"]
    assert _imported_commands(["health", "--help"]) == ["cli.health"]


def test_a_group_without_its_subcommand_names_what_is_missing(capsys):
    assert main(["serve"]) == 2
    assert "service" in capsys.readouterr().err
