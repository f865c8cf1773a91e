"""Model files a peer needs besides the GGUF, made once and cached next to the venvs.

OpenVINO GenAI reads OpenVINO IR, exported from the GGUF by ``runners/export_openvino.py`` in
the openvino venv; transformers (and kvpress) read a Hugging Face directory that
``runners/export_hf.py`` writes from the GGUF in their venv (transformers' GGUF loader spends
minutes parsing Gemma 3's metadata at every load; the directory loads in seconds). Each is cached
under ``<peers root>/models/<kind>-<key>``, ``key`` hashing the GGUF's bytes, the venv's recipe
and the export scripts, so any of them changing makes a new export.

The prompts are tokenized by transformers' tokenizer read from the GGUF, which converts the
vocabulary first (minutes for Gemma 3's 262k tokens): it is saved once under
``<peers root>/models/tokenizer-<key>`` (``key``: the GGUF's bytes and transformers' version).
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from bench.peers.runners import RUNNERS
from bench.peers.venvs import COMPLETE_MARKER, Echo, Venv, peers_root, run_logged

EXPORT_SCRIPT = RUNNERS / "export_openvino.py"
HF_SCRIPT = RUNNERS / "export_hf.py"  # export_openvino.py runs it too


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_dir(kind: str, parts: tuple[str, ...], make: Callable[[Path], None],
               root: Path | None = None) -> Path:
    """``<peers root>/models/<kind>-<key>`` (``key`` hashing ``parts``), ``make(out)`` run
    first under a lock unless a complete one is there."""
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]
    out = (root or peers_root()) / "models" / f"{kind}-{key}"
    if (out / COMPLETE_MARKER).exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / COMPLETE_MARKER).exists():
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            make(out)
            (out / COMPLETE_MARKER).write_text(f"{time.perf_counter() - start:.1f}\n")
    return out


def openvino_ir(venv: Venv, gguf: Path, echo: Echo, root: Path | None = None) -> Path:
    """The IR directory of ``gguf`` (fp32), exported first if the cache has none."""
    parts = (file_digest(gguf), venv.spec.key, file_digest(EXPORT_SCRIPT),
             file_digest(HF_SCRIPT))

    def export(out: Path) -> None:
        _export(venv, "the OpenVINO export", [EXPORT_SCRIPT, gguf, out], out, echo)
        shutil.rmtree(out / "hf")  # the fp32 safetensors are only the IR's source

    return cached_dir("openvino", parts, export, root) / "ir"


def hf_model_dir(venv: Venv, gguf: Path, echo: Echo, root: Path | None = None) -> Path:
    """``gguf`` as transformers in ``venv`` reads it (float32), saved as a Hugging Face
    directory (no tokenizer) first if the cache has none."""
    parts = (file_digest(gguf), venv.spec.key, file_digest(HF_SCRIPT))
    return cached_dir("hf", parts, lambda out: _export(
        venv, "the Hugging Face export", [HF_SCRIPT, gguf, out / "model"], out, echo),
        root) / "model"


def tokenizer_dir(gguf: Path, echo: Echo, root: Path | None = None) -> Path:
    """transformers' tokenizer of ``gguf``, converted and saved first if the cache has none."""
    import transformers

    def convert(out: Path) -> None:
        echo(f"converting {gguf.name}'s tokenizer with transformers (once; cached at {out})")
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent),
                                                               gguf_file=gguf.name)
        tokenizer.save_pretrained(out)

    return cached_dir("tokenizer", (file_digest(gguf), transformers.__version__), convert, root)


def _export(venv: Venv, what: str, argv: list[Path], out: Path, echo: Echo) -> None:
    """``argv`` (a script in runners/ and its arguments) run with ``venv``'s python, its
    output logged next to ``out``."""
    log_path = out.parent / f"{out.name}.log"
    echo(f"{what} of {argv[1].name} to {out} (log: {log_path})")
    start = time.perf_counter()
    with open(log_path, "w") as log:
        run_logged(what, argv[0].name, [str(venv.python), *map(str, argv)],
                   {"TQDM_MININTERVAL": "10"}, log, log_path, echo, progress=re.compile(r"\S"))
    echo(f"exported in {time.perf_counter() - start:.0f} s")
