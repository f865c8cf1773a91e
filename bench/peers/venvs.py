"""Bench-only virtualenvs, one per peer, built on demand and cached by the hash of their recipe.

A venv lives at ``<root>/<name>-<key>`` where ``key`` hashes everything that decides its
contents (Python minor version, requirements, build steps): changing a pin makes a new venv, an
unchanged recipe reuses the old one. ``root`` is ``$SNAPSTREAM_PEERS_HOME`` or
``$XDG_CACHE_HOME/snapstream/peers`` (``~/.cache/snapstream/peers``), outside the repository.
A venv is usable only once its ``.complete`` marker exists; a half-built one is wiped and
rebuilt. Builds take a file lock, so two benchmarks never build the same venv at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

COMPLETE_MARKER = ".complete"
Echo = Callable[[str], None]

# build output worth showing the user; everything goes to the log file
PROGRESS_LINES = re.compile(
    r"^(Collecting|Downloading|Installing|Successfully|Building|Created wheel|ERROR|error"
    r"|\s*\[\s*\d+%\]|\s*\[\d+/\d+\]|-- Configuring done|-- Build files)")


class PeerBuildError(RuntimeError):
    """A peer venv could not be built; the message names the step and the log file."""


@dataclass(frozen=True)
class Step:
    """One build command. ``{python}``, ``{venv}`` and ``{jobs}`` (the CPU count) in ``argv`` are
    filled in at build time; ``env`` is added to the environment of that command only."""

    title: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError(f"Step {self.title!r}: argv is empty")


@dataclass(frozen=True)
class VenvSpec:
    """A venv's recipe: ``pip install requirements`` (with ``pip_env`` added to its
    environment), then ``steps`` in order."""

    name: str
    requirements: tuple[str, ...]
    pip_env: tuple[tuple[str, str], ...] = ()
    steps: tuple[Step, ...] = ()
    python_tag: str = field(default=f"{sys.version_info.major}.{sys.version_info.minor}")

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", self.name):
            raise ValueError(f"VenvSpec.name {self.name!r}: use lowercase letters, digits, - or _")
        if not self.requirements:
            raise ValueError(f"VenvSpec {self.name!r}: requirements is empty")

    @property
    def key(self) -> str:
        recipe = {"python": self.python_tag, "requirements": list(self.requirements),
                  "pip_env": [list(e) for e in self.pip_env],
                  "steps": [[s.title, list(s.argv), [list(e) for e in s.env]]
                            for s in self.steps]}
        blob = json.dumps(recipe, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.key}"


def peers_root() -> Path:
    if explicit := os.environ.get("SNAPSTREAM_PEERS_HOME"):
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "snapstream" / "peers"


@dataclass(frozen=True)
class Venv:
    """A built venv: where it is and what it holds."""

    spec: VenvSpec
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def info(self) -> dict:
        """``build_s`` and ``versions`` (the ``pip freeze`` of the venv) recorded at build."""
        return json.loads((self.path / COMPLETE_MARKER).read_text())


def venv_path(spec: VenvSpec, root: Path | None = None) -> Path:
    return (root or peers_root()) / spec.dirname


def find_venv(spec: VenvSpec, root: Path | None = None) -> Venv | None:
    path = venv_path(spec, root)
    return Venv(spec, path) if (path / COMPLETE_MARKER).exists() else None


def ensure_venv(spec: VenvSpec, echo: Echo, root: Path | None = None) -> Venv:
    """The venv of ``spec``, built first if the cache has no complete one."""
    root = root or peers_root()
    if venv := find_venv(spec, root):
        return venv
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{spec.dirname}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if venv := find_venv(spec, root):  # built by someone else while we waited
            return venv
        return _build(spec, root, echo)


def _build(spec: VenvSpec, root: Path, echo: Echo) -> Venv:
    path = venv_path(spec, root)
    log_path = root / f"{spec.dirname}.log"
    shutil.rmtree(path, ignore_errors=True)
    echo(f"building the {spec.name} venv at {path} (log: {log_path})")
    start = time.perf_counter()
    python = str(path / "bin" / "python")
    pip = (python, "-m", "pip", "install", "--progress-bar", "off", *spec.requirements)
    steps = (Step("create venv", (sys.executable, "-m", "venv", str(path))),
             Step("pip install", pip, spec.pip_env), *spec.steps)
    fill = {"python": python, "venv": path, "jobs": os.cpu_count() or 1}
    with open(log_path, "w") as log:
        for number, step in enumerate(steps, 1):
            echo(f"[{spec.name} {number}/{len(steps)}] {step.title}")
            argv = [a.format(**fill) for a in step.argv]
            run_logged(f"building the {spec.name} venv", step.title, argv, dict(step.env), log,
                       log_path, echo)
    freeze = subprocess.run([python, "-m", "pip", "freeze"], check=True, capture_output=True,
                            text=True).stdout.split()
    build_s = time.perf_counter() - start
    info = {"name": spec.name, "key": spec.key, "build_s": round(build_s, 1),
            "requirements": list(spec.requirements), "versions": freeze}
    (path / COMPLETE_MARKER).write_text(json.dumps(info, indent=1))
    echo(f"built the {spec.name} venv in {build_s / 60:.1f} min")
    return Venv(spec, path)


def run_logged(what: str, title: str, argv: list[str], env: dict[str, str], log: IO[str],
               log_path: Path, echo: Echo, progress: re.Pattern = PROGRESS_LINES) -> None:
    """Run one build command: all output to ``log``, lines matching ``progress`` to ``echo``;
    a failure raises ``PeerBuildError`` naming ``what``, ``title``, the log and its last
    lines."""
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    full_env = {**os.environ, **env}
    full_env.pop("PYTHONPATH", None)
    tail: deque[str] = deque(maxlen=4)
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=full_env, text=True,
                                errors="replace")
    except OSError as exc:
        raise PeerBuildError(f"{what} failed at {title!r}: {exc}") from exc
    for line in proc.stdout:
        log.write(line)
        log.flush()
        tail.append(line.rstrip())
        if progress.match(line):
            echo(f"  {line.strip()[:150]}")
    log.flush()
    if code := proc.wait():
        raise PeerBuildError(f"{what} failed at {title!r} (exit {code}); full log: {log_path}; "
                             f"last lines: {' | '.join(tail)}")
