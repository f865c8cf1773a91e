"""Model files a peer needs besides the GGUF, made once and cached next to the venvs.

OpenVINO GenAI reads OpenVINO IR, exported from the GGUF by ``runners/export_openvino.py`` in
the openvino venv. The export is cached under ``<peers root>/models/openvino-<key>``, ``key``
hashing the GGUF's bytes, the venv's recipe and the export script, so any of them changing
makes a new export.

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
    parts = (file_digest(gguf), venv.spec.key, file_digest(EXPORT_SCRIPT))
    return cached_dir("openvino", parts, lambda out: _export(venv, gguf, out, echo), root) / "ir"


def tokenizer_dir(gguf: Path, echo: Echo, root: Path | None = None) -> Path:
    """transformers' tokenizer of ``gguf``, converted and saved first if the cache has none."""
    import transformers

    def convert(out: Path) -> None:
        echo(f"converting {gguf.name}'s tokenizer with transformers (once; cached at {out})")
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent),
                                                               gguf_file=gguf.name)
        tokenizer.save_pretrained(out)

    return cached_dir("tokenizer", (file_digest(gguf), transformers.__version__), convert, root)


def _export(venv: Venv, gguf: Path, out: Path, echo: Echo) -> None:
    log_path = out.parent / f"{out.name}.log"
    echo(f"exporting {gguf.name} to OpenVINO IR at {out} (log: {log_path})")
    start = time.perf_counter()
    with open(log_path, "w") as log:
        run_logged("the OpenVINO export", "export_openvino.py",
                   [str(venv.python), str(EXPORT_SCRIPT), str(gguf), str(out)],
                   {"TQDM_MININTERVAL": "10"}, log, log_path, echo, progress=re.compile(r"\S"))
    shutil.rmtree(out / "hf")  # the fp32 safetensors are only the IR's source
    echo(f"exported in {time.perf_counter() - start:.0f} s")
