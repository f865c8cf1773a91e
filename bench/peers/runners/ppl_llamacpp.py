"""llama.cpp's teacher-forced next-token scores on given token ids (``bench.blocks_bench
agreement``).

Run with the llamacpp venv's python and ``LLAMA_CPP_LIB_PATH`` naming the build's bin/:
``python ppl_llamacpp.py MODEL.gguf IDS.json [--n-batch 512] [--threads 2]``. The ids are fed
as they are (llama.cpp's tokenizer is never used, no BOS is added): ids[:-1] are decoded in one
sequence, ``n_batch`` at a time with logits for every token, so the row of position i predicts
ids[i + 1] from ids[0..i], for every i from 0 to len(ids) - 2, as snapstream's teacher-forced
pass scores them. The logits of one batch at a time are held (never n_ctx x vocabulary: Gemma 3's
262k vocabulary would take 4 GiB at 4k tokens). Prints one JSON object: ``nll`` and ``top1``
per position, and the settings llama.cpp ran with.

Importable without llama_cpp (its import is inside :func:`run`), so the scoring is tested alone.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path

import numpy as np

ROWS_AT_ONCE = 64  # rows of a batch's logits turned into log-probabilities together

# (tokens, n_past) -> (len(tokens), vocabulary) logits, every token's row
DecodeBatch = Callable[[Sequence[int], int], np.ndarray]


def next_token_nll(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's negative log-likelihood of its target (float64) and its argmax.
    ``logits`` (rows, V), ``targets`` (rows,)."""
    nll, top1 = [], []
    for at in range(0, len(targets), ROWS_AT_ONCE):
        rows = logits[at:at + ROWS_AT_ONCE].astype(np.float64)  # (r, V)
        shifted = rows - rows.max(-1, keepdims=True)
        log_total = np.log(np.exp(shifted).sum(-1))  # (r,)
        picked = shifted[np.arange(len(rows)), targets[at:at + ROWS_AT_ONCE]]  # (r,)
        nll.append(log_total - picked)
        top1.append(rows.argmax(-1))
    return np.concatenate(nll), np.concatenate(top1)


def score_ids(decode_batch: DecodeBatch, ids: Sequence[int], n_batch: int) -> dict[str, list]:
    """Teacher-forced NLL and top-1 of ids[i + 1] given ids[0..i] for i in 0..len(ids) - 2:
    ids[:-1] go to ``decode_batch`` in order, ``n_batch`` at a time, as one sequence."""
    if len(ids) < 2:
        raise ValueError(f"{len(ids)} token ids: give at least 2 (one to predict)")
    nll, top1 = [], []
    for start in range(0, len(ids) - 1, n_batch):
        tokens = ids[start:min(start + n_batch, len(ids) - 1)]
        logits = decode_batch(tokens, start)  # (len(tokens), V)
        got_nll, got_top1 = next_token_nll(logits, np.asarray(ids[start + 1:start + 1 +
                                                                  len(tokens)]))
        nll.append(got_nll)
        top1.append(got_top1)
    return {"nll": np.concatenate(nll).tolist(), "top1": np.concatenate(top1).tolist()}


def run(model: Path, ids: list[int], n_batch: int, n_threads: int) -> dict:
    """Through llama.cpp's C API (the bindings' ``Llama`` cannot set ``use_extra_bufts``)."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    model_params = llama_cpp.llama_model_default_params()
    # no extra buffer types (weight repacking, AMX): this machine's CPU reports AMX, but in its
    # VM the first AMX instruction (tilezero in ggml's AMX GEMM) dies with SIGILL; the plain CPU
    # buffers compute the same quantized dot products
    model_params.use_extra_bufts = False
    llama_model = llama_cpp.llama_model_load_from_file(str(model).encode(), model_params)
    if not llama_model:
        raise RuntimeError(f"llama.cpp could not load {model}")
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = len(ids), n_batch, n_batch
    params.n_threads, params.n_threads_batch = n_threads, n_threads
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = llama_cpp.llama_init_from_model(llama_model, params)
    batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
    try:
        vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llama_model))
        if not all(0 <= i < vocab for i in ids):
            raise ValueError(f"token ids outside {model.name}'s vocabulary of {vocab}: give "
                             "ids from the same model's tokenizer")

        def decode_batch(tokens: Sequence[int], n_past: int) -> np.ndarray:
            batch.n_tokens = len(tokens)
            for i, token in enumerate(tokens):
                batch.token[i], batch.pos[i] = token, n_past + i
                batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, 0, True
            if (code := llama_cpp.llama_decode(ctx, batch)) != 0:
                raise RuntimeError(f"llama_decode returned {code} at position {n_past}")
            return np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx),
                                         shape=(len(tokens), vocab))  # (T, V)

        scores = score_ids(decode_batch, ids, n_batch)
        n_ctx = llama_cpp.llama_n_ctx(ctx)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(llama_model)
    return {**scores, "settings": {
        "n_ctx": n_ctx, "n_batch": n_batch, "n_threads": n_threads, "flash_attn": False,
        "swa_full": bool(params.swa_full), "use_extra_bufts": False,
        "type_k": _ggml_type(params.type_k), "type_v": _ggml_type(params.type_v)},
        "versions": {"llama-cpp-python": version("llama-cpp-python")}}


def _ggml_type(value: int) -> str:
    """``GGML_TYPE_F16`` (1) as ``f16``: the name the bindings give the ggml type number."""
    import llama_cpp

    names = [n for n in dir(llama_cpp) if n.startswith("GGML_TYPE_") and
             getattr(llama_cpp, n) == value]
    return names[0].removeprefix("GGML_TYPE_").lower() if names else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("ids", type=Path, help="a JSON list of token ids")
    parser.add_argument("--n-batch", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    ids = json.loads(args.ids.read_text())
    print(json.dumps(run(args.model, ids, args.n_batch, args.threads)))


if __name__ == "__main__":
    main()
