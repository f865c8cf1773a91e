"""Decode worker capacity: streams of long prompts one decode worker holds within a memory budget,
against llama-server's ``--parallel`` at the same memory (writes docs/benchmarks.md).

Counted from the layouts: a snapstream stream is a row of the decode pool
(``kvcache.pool_row_bytes``: the model's default policy at the prompt, in the KV dtype), next to
the weights as the engine holds them; a llama.cpp stream is a slot of ``n_ctx`` cells of f16 K
and V (``kv_cli.llama_cpp_kv_bytes``), next to the GGUF file. Streams in the budget =
(budget − weights) // per stream.

Measured: snapstream in a fresh process that loads the engine as a decode worker does,
prefills one prompt, copies its compressed cache into every row of a pool of that many rows (so
every page is written, as live streams would) and runs decode steps over all of them; RSS before
the pool and after the steps. llama.cpp: ``llama-server --parallel N --ctx-size N × n_ctx`` from
the peer venv (as ``bench peers`` starts it), RSS once /health answers (it clears its KV buffer
at start, so the whole cache is resident).
"""

from __future__ import annotations

import argparse
import ctypes
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import torch

from bench.kv_cli import llama_cpp_kv_bytes
from bench.limits import model_bytes
from bench.peers import recipes
from bench.peers.venvs import find_venv
from bench.report import command_line, machine_line, markdown_table, publish
from serving.settings import add_model_setting
from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.registry import model_path
from snapstream.engine import Engine
from snapstream.kvcache import pool_row_bytes

GIB = 2**30
MIB = 2**20
F16_BYTES = 2
BASE_N_CTX = 256  # llama-server's RSS "without the streams": one slot of this many cells


def register(parser: argparse.ArgumentParser) -> None:
    add_model_setting(parser)
    parser.add_argument("--budget-gib", type=float, default=4.0,
                        help="memory of one decode worker (or one llama-server)")
    parser.add_argument("--n-ctx", type=int, default=8192,
                        help="tokens per stream: llama.cpp's n_ctx per slot; snapstream's "
                             "prompt is n_ctx - --new-tokens")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--kv-dtypes", default="bfloat16,int8",
                        help="snapstream KV dtypes to count and measure")
    parser.add_argument("--steps", type=int, default=2, help="decode steps over the full pool")
    parser.add_argument("--measure-fraction", type=float, default=1.0,
                        help="measure RSS at this fraction of the counted streams (1: at the "
                             "count itself); the rest is extrapolated")
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--no-doc", action="store_true", help="print only")


@dataclass(frozen=True)
class Row:
    system: str
    per_stream: int  # bytes of KV per stream
    weights: int  # bytes
    counted: int  # streams in the budget, from the layout
    measured_streams: int
    rss_base: int  # RSS without the streams' KV (snapstream: before the pool)
    rss: int  # RSS holding measured_streams


def run(args: argparse.Namespace) -> int:
    model = model_path(args.model)
    budget = round(args.budget_gib * GIB)
    rows = [_snapstream_row(model, dtype, args, budget)
            for dtype in args.kv_dtypes.split(",") if dtype]
    rows.append(_llama_row(model, args, budget))
    publish(_render(rows, args, budget), "capacity", None if args.no_doc else args.doc)
    return 0


def _snapstream_row(model: Path, kv_dtype: str, args: argparse.Namespace, budget: int) -> Row:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        got = pool.submit(_hold, str(model), kv_dtype, args.n_ctx - args.new_tokens,
                          args.new_tokens, budget, args.measure_fraction, args.steps).result()
    return Row(system=f"snapstream decode pool, {kv_dtype} KV", **got)


def _hold(model: str, kv_dtype: str, prompt_len: int, new_tokens: int, budget: int,
          fraction: float, steps: int) -> dict[str, int]:
    """In a fresh process: the engine as a decode worker loads it, and a pool of the streams
    that fit in ``budget`` (times ``fraction``), each row holding one prefilled prompt's
    compressed cache, after ``steps`` decode steps over all of them. -> the fields of a Row."""
    engine = Engine.from_pretrained(model, kv_dtype=kv_dtype)
    vocab = engine.config.vocab_size
    ids = [(7 * i) % (vocab - 3) + 3 for i in range(prompt_len)]  # any tokens: one row size
    result = engine.prefill(ids, engine.default_policy, new_tokens)
    weights = model_bytes(engine.model)
    per_stream = pool_row_bytes(engine.config, result.cache.layout, engine.kv_dtype)
    counted = (budget - weights) // per_stream
    streams = max(1, int(counted * fraction))
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # the prompt's freed buffers: a decode worker
    base = _rss()  # never prefills, its blobs come from the store
    decoder = engine.new_decoder(result.cache.layout, streams)
    for row in range(streams):
        decoder.cache.insert(row, result.cache)
    tokens = torch.full((streams,), int(result.logits.argmax()))  # (B,)
    positions = torch.full((streams,), prompt_len)  # (B,)
    for _ in range(steps):
        tokens = decoder.step(tokens, positions).argmax(dim=-1)  # (B,)
        positions += 1
    return {"per_stream": per_stream, "weights": weights, "counted": counted,
            "measured_streams": streams, "rss_base": base, "rss": _rss()}


def _rss(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def _llama_row(model: Path, args: argparse.Namespace, budget: int) -> Row:
    config = open_checkpoint(str(model)).config
    token_bytes = 2 * config.num_kv_heads * config.head_dim * F16_BYTES  # K and V, one layer
    per_stream = llama_cpp_kv_bytes(config.attention_windows, token_bytes, args.n_ctx)
    weights = model.stat().st_size
    counted = (budget - weights) // per_stream
    streams = max(1, int(counted * args.measure_fraction))
    base = _llama_server_rss(model, 1, BASE_N_CTX)
    rss = _llama_server_rss(model, streams, args.n_ctx)
    return Row(f"llama-server --parallel, f16 KV, n_ctx {args.n_ctx} per slot", per_stream,
               weights, counted, streams, base, rss)


def _llama_server_rss(model: Path, parallel: int, n_ctx: int) -> int:
    """RSS of ``llama-server --parallel parallel`` once it answers /health."""
    venv = find_venv(recipes.LLAMACPP)
    if venv is None:
        raise SystemExit("the llama.cpp peer venv is not built: run `snapstream bench peers` "
                         "once (it builds it)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [str(venv.path / recipes.LLAMA_BUILD_DIR / "bin" / "llama-server"), "--model",
            str(model), "--host", "127.0.0.1", "--port", str(port), "--ctx-size",
            str(n_ctx * parallel), "--parallel", str(parallel), "--cont-batching",
            "--flash-attn", "off", "--threads", "2"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}/health")
        return _rss(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"llama-server not healthy at {url} after {timeout_s} s")


def _render(rows: list[Row], args: argparse.Namespace, budget: int) -> str:
    table = markdown_table(
        ["system", "KV per stream MiB", "weights MiB", f"streams in {args.budget_gib:g} GiB "
         "(layout)", "streams held", "RSS without them MiB", "RSS holding them MiB",
         "RSS per stream MiB", f"streams in {args.budget_gib:g} GiB (measured RSS)"],
        [[row.system, f"{row.per_stream / MIB:.1f}", f"{row.weights / MIB:.0f}", row.counted,
          row.measured_streams, f"{row.rss_base / MIB:.0f}", f"{row.rss / MIB:.0f}",
          f"{(row.rss - row.rss_base) / row.measured_streams / MIB:.1f}",
          _measured_capacity(row, budget)] for row in rows])
    llama = rows[-1]
    ratios = ", ".join(f"{row.system}: {row.counted / llama.counted:.1f}x"
                       for row in rows[:-1])
    return "\n".join([
        "## Decode worker capacity: long-prompt streams within a memory budget", "",
        f"Command: `{command_line()}`  ", f"Machine: {machine_line()}", "",
        f"Streams of {args.n_ctx}-token contexts (snapstream: prompts of "
        f"{args.n_ctx - args.new_tokens} tokens + {args.new_tokens} new, in the default "
        "policy's fixed rows; llama.cpp: slots of n_ctx cells) that one process holds in "
        f"{args.budget_gib:g} GiB. Layout: (budget − weights) // KV per stream. Measured: "
        "snapstream, a process that loads the engine as a decode worker does, prefills one "
        "prompt (its freed buffers handed back to the OS with `malloc_trim` before 'RSS "
        "without them': a decode worker gets its caches from the store), copies its "
        "compressed cache into every row of a pool of 'streams held' rows "
        f"and runs {args.steps} decode steps over all of them (RSS before the pool / after); "
        f"llama-server started with `--parallel N --ctx-size N × n_ctx` (RSS with one slot of "
        f"{BASE_N_CTX} cells / at N, once /health answers). 'measured RSS' = (budget − RSS "
        "without them) // RSS per stream. Streams in the budget against llama-server's, from "
        f"the layout: {ratios}.",
        "", table])


def _measured_capacity(row: Row, budget: int) -> str:
    per_stream = (row.rss - row.rss_base) / row.measured_streams
    return str(int((budget - row.rss_base) // per_stream)) if per_stream > 0 else "—"
