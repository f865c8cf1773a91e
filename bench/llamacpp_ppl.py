"""llama.cpp's teacher-forced scores of token ids on a GGUF file, for ``bench.blocks_bench
agreement``: the runner ``ppl_llamacpp.py`` in a subprocess with the llamacpp peer venv's python
(built on first use by ``bench.peers.venvs``, as ``snapstream bench peers`` builds it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.peers import recipes
from bench.peers.runners import RUNNERS
from bench.peers.systems import get_system
from bench.peers.venvs import PeerBuildError, ensure_venv
from snapstream.checkpoints.gguf_file import is_gguf

RUNNER = RUNNERS / "ppl_llamacpp.py"


def llamacpp_scores(model: Path, ids: list[int], n_threads: int) -> dict:
    """``nll`` and ``top1`` of ids[i + 1] after ids[0..i] for every i, with llama.cpp's
    ``settings`` and ``versions``; or ``{"missing": why}`` when llama.cpp cannot run here (not
    a GGUF file, the venv could not be built). A failing runner raises ``RuntimeError``."""
    if not is_gguf(model):
        return {"missing": f"{model} is not a GGUF file (llama.cpp reads only GGUF)"}
    try:
        venv = ensure_venv(recipes.LLAMACPP, lambda line: print(line, file=sys.stderr,
                                                                 flush=True))
    except PeerBuildError as exc:
        return {"missing": f"no llama.cpp: {exc}"}
    env = {**os.environ, **get_system("llama.cpp").runner_env(venv)}
    with tempfile.TemporaryDirectory() as tmp:
        ids_file = Path(tmp) / "ids.json"
        ids_file.write_text(json.dumps(ids))
        run = subprocess.run([str(venv.python), str(RUNNER), str(model), str(ids_file),
                              "--threads", str(n_threads)], env=env, capture_output=True,
                             text=True)
    if run.returncode != 0:
        tail = " | ".join(run.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{RUNNER.name} failed (exit {run.returncode}): {tail}")
    return json.loads(run.stdout)


def llamacpp_agreement(cpp: dict, nll: dict[str, np.ndarray], top1: dict[str, np.ndarray]) -> dict:
    """llama.cpp's perplexity and top-1 over the positions the engines scored (``nll`` and
    ``top1`` per format, position i predicting token i + 1), against each format; ``cpp`` as
    :func:`llamacpp_scores` returns it (``missing`` passes through)."""
    if "missing" in cpp:
        return {"missing": cpp["missing"]}
    cpp_nll, cpp_top1 = np.asarray(cpp["nll"]), np.asarray(cpp["top1"])
    positions = {f: len(v) for f, v in nll.items()}
    if any(n != len(cpp_nll) for n in positions.values()):
        raise RuntimeError(f"llama.cpp scored {len(cpp_nll)} positions, the engines {positions}")
    ppl = float(np.exp(cpp_nll.mean()))
    return {"ppl": ppl, **{f"ppl_vs_{f}": ppl / float(np.exp(v.mean())) for f, v in nll.items()},
            **{f"top1_vs_{f}": float((cpp_top1 == v).mean()) for f, v in top1.items()},
            "settings": cpp["settings"], "versions": cpp["versions"]}
