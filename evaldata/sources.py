"""Real Python source on this machine, grouped into repositories, and the functions in it that a
code-search question may ask for.

Repositories: each package of this interpreter's standard library (its top-level modules
together form ``stdlib``) less ``SKIPPED_STDLIB`` (generated tables, data, demos), and the
packages ``SITE_REPOS`` of the running environment's site-packages where they are installed.
Files: ``.py`` files outside test directories, readable as UTF-8 and parsed by this Python,
of at least ``MIN_FILE_CHARS`` characters, in path order, with the lines of each top-level
statement (the ranges a part of a file is cut along). Both depend on the Python version and the
installed packages; :func:`fingerprint` identifies them.

A function is a candidate when it is defined at a module's top level, its name is public
(no leading underscore) and its source (decorators included) names it once (it does not call
itself) in at most ``MAX_FUNCTION_CHARS`` characters, and it has a docstring.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

MIN_FILE_CHARS = 400
MAX_FUNCTION_CHARS = 2_000
SKIPPED_STDLIB = frozenset({"encodings", "pydoc_data", "turtledemo", "ensurepip", "site-packages",
                            "__phello__", "__pycache__"})
SKIPPED_DIRS = frozenset({"test", "tests", "testing", "idle_test", "_vendor", "__pycache__"})
SITE_REPOS = ("jinja2", "networkx", "fsspec")
STDLIB_MODULES = "stdlib"  # the repository of the standard library's top-level modules


@dataclass(frozen=True)
class SourceFile:
    """``statements``: each top-level statement's characters ``[start, end)`` in ``text``, whole
    lines, decorators included, in order."""

    repo: str
    path: str  # as the haystack's file header shows it, relative to its root: email/utils.py
    text: str
    statements: tuple[tuple[int, int], ...]

    def part(self, first: int, last: int) -> str:
        """Statements ``first`` to ``last`` (inclusive) and the lines between them."""
        return self.text[self.statements[first][0] : self.statements[last][1]]


@dataclass(frozen=True)
class Function:
    """A candidate function: its file, name, docstring and its statement's index in the file."""

    file: SourceFile
    name: str
    docstring: str
    statement: int

    @property
    def source(self) -> str:
        return self.file.part(self.statement, self.statement)


def mentions(text: str, name: str) -> int:
    """How often ``name`` occurs in ``text`` as a whole identifier."""
    return len(re.findall(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text))


def repositories() -> dict[str, tuple[SourceFile, ...]]:
    """Every repository's files, repositories in name order."""
    return _scan()[0]


def functions() -> tuple[Function, ...]:
    """Every candidate function of every repository, in repository and file order."""
    return _scan()[1]


@functools.cache
def _scan() -> tuple[dict[str, tuple[SourceFile, ...]], tuple[Function, ...]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    paths = []
    for path in sorted(stdlib.rglob("*.py")):
        parts = path.relative_to(stdlib).parts
        repo = parts[0] if len(parts) > 1 else STDLIB_MODULES
        if repo not in SKIPPED_STDLIB and not repo.startswith("config-"):
            paths.append((repo, path, stdlib))
    paths += [(repo, path, site) for repo in SITE_REPOS
              for path in sorted((site / repo).rglob("*.py"))]
    repos: dict[str, list[SourceFile]] = {}
    found: list[Function] = []
    for repo, path, root in paths:
        if (parsed := _read(repo, path, root)) is not None:
            file, module = parsed
            repos.setdefault(repo, []).append(file)
            found += _functions(file, module)
    found.sort(key=lambda fn: fn.file.repo)  # stable: file order within a repository
    return {repo: tuple(repos[repo]) for repo in sorted(repos)}, tuple(found)


def _read(repo: str, path: Path, root: Path) -> tuple[SourceFile, ast.Module] | None:
    relative = path.relative_to(root)
    if SKIPPED_DIRS & set(relative.parts):
        return None
    try:
        text = path.read_text(encoding="utf-8")
        module = ast.parse(text) if len(text) >= MIN_FILE_CHARS else None
    except (UnicodeDecodeError, OSError, SyntaxError, ValueError):
        return None
    if module is None or not module.body:
        return None
    line_starts = [0, *(m.end() for m in re.finditer("\n", text)), len(text)]
    statements = tuple((line_starts[first], line_starts[min(last, len(line_starts) - 1)])
                       for first, last in map(_lines, module.body))
    return SourceFile(repo, relative.as_posix(), text, statements), module


def _functions(file: SourceFile, module: ast.Module) -> list[Function]:
    found = []
    for index, node in enumerate(module.body):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        docstring = ast.get_docstring(node)
        fn = Function(file=file, name=node.name, docstring=docstring or "", statement=index)
        if (docstring and not node.name.startswith("_") and len(fn.source) <= MAX_FUNCTION_CHARS
                and mentions(fn.source, node.name) == 1):
            found.append(fn)
    return found


def _lines(node: ast.stmt) -> tuple[int, int]:
    """A top-level statement's lines [first, last), 0-based, decorators included."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
    return first - 1, node.end_lineno or node.lineno


def fingerprint() -> str:
    """A digest of every repository's file paths and texts."""
    digest = hashlib.sha256()
    for files in repositories().values():
        for file in files:
            digest.update(f"{file.repo}\0{file.path}\0{file.text}\0".encode())
    return digest.hexdigest()[:16]
