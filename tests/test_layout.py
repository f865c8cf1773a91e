"""The tree's layering: every import, at any depth of a function, runs downward.

Read from the source with ``ast`` (nothing is imported), so a lazy import inside a function
counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# top to bottom; a package may import only packages of lower layers (and itself)
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),  # the `snapstream` command
    ("evaluation",),  # accuracy harness
    ("bench",),  # benchmarks
    ("router", "prefill_svc", "decode_svc", "cluster"),  # the services; the local cluster
    ("serving",),  # the services' shared plumbing
    ("kvstore", "hwsim", "evaldata"),  # blob codec + stores; SN40L model; eval data sets
    ("snapstream",),  # the runtime: engine and SDK
)
PACKAGES = {package: depth for depth, layer in enumerate(LAYERS) for package in layer}
# what the blob codec may know of the runtime: the cache's description, not the engine
KVSTORE_MAY_IMPORT = {"snapstream.config", "snapstream.kvcache", "snapstream.kvquant",
                      "snapstream.policy"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for package in PACKAGES
            for path in sorted((ROOT / package).rglob("*.py"))}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports (``from a import b`` names a.b when b is one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
    return {name for name in found if name.split(".")[0] in PACKAGES}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) for name, path in modules.items()}


def test_every_package_is_placed_in_a_layer():
    on_disk = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests"}
    assert on_disk == set(PACKAGES)


def test_packages_import_only_lower_layers(graph):
    upward = sorted(f"{module} -> {target}" for module, targets in graph.items()
                    for target in targets
                    if target.split(".")[0] != module.split(".")[0]
                    and PACKAGES[target.split(".")[0]] <= PACKAGES[module.split(".")[0]])
    assert not upward, "imports that do not run downward:\n" + "\n".join(upward)


def test_the_blob_codec_does_not_import_the_engine(graph):
    runtime = {target for module, targets in graph.items() if module.startswith("kvstore")
               for target in targets if target.startswith("snapstream")}
    assert runtime <= KVSTORE_MAY_IMPORT


def test_the_runtime_core_does_not_import_speculative_prefill(graph):
    # speculative prefill drives the engine (selector -> Engine), never the other way round
    upward = sorted(f"{module} -> {target}" for module, targets in graph.items()
                    if module.startswith("snapstream.")
                    and not module.startswith("snapstream.specprefill")
                    for target in targets if target.startswith("snapstream.specprefill"))
    assert not upward, "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_package_imports_another_in_a_cycle(graph):
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        packages[module.split(".")[0]].update(t.split(".")[0] for t in targets)
    for package, targets in packages.items():
        targets.discard(package)
    assert _cycles(packages) == []


def test_no_module_imports_another_in_a_cycle(graph):
    # a package's __init__ that re-exports its modules is not a cycle with them
    edges = {module: {t for t in targets if not module.startswith(t + ".")}
             for module, targets in graph.items()}
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_loading_the_codec_leaves_the_engine_unloaded():
    code = ("import sys, kvstore.codec; "
            "sys.exit(1 if 'snapstream.engine' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
