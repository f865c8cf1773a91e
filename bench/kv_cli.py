"""KV bytes per sequence: snapstream's layer groups against the full cache and llama.cpp's.

Computed from the model's config and the cache rules, nothing run: snapstream's layout (the
policy's on global layers, a ring of the window on sliding ones, plus an int32 position per
slot, as sequence caches and blobs hold it), a decode pool's row of the default policy (K/V and
a slot mask, ``kvcache.pool_row_bytes``), the naive full cache (every layer holds the
prompt), and llama.cpp's SWA cache for one sequence at ``n_ctx`` = the prompt
(``llama_kv_cache_iswa``: the non-SWA layers hold ``n_ctx`` cells, the SWA layers
``GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256)``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.report import command_line, markdown_table, parse_ints, publish
from kvstore.codec import POSITION_BYTES
from serving.settings import add_model_setting
from snapstream.checkpoints import open_checkpoint
from snapstream.kvcache import ModelLayout, pool_row_bytes
from snapstream.kvquant import kv_codec, kv_slot_bytes
from snapstream.policy import CachePolicy, load_default_policy
from snapstream.weight_formats import KV_DTYPES

LLAMA_CPP_UBATCH = 512  # llama.cpp's default n_ubatch
LLAMA_CPP_SWA_PAD = 256  # "the SWA cache is always padded to 256"


def register(parser: argparse.ArgumentParser) -> None:
    add_model_setting(parser)
    parser.add_argument("--lengths", type=parse_ints, default=(4096, 16384, 32768),
                        help="prompt tokens")
    parser.add_argument("--kv-dtype", default="bfloat16", choices=KV_DTYPES,
                        help="snapstream's K/V (int8: D codes + a float32 scale per slot and "
                             "head); llama.cpp's and the full cache are f16, 2 bytes")
    parser.add_argument("--doc", type=Path, default=Path("docs/model.md"))
    parser.add_argument("--no-doc", action="store_true", help="print only")


def _pad(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def llama_cpp_kv_bytes(windows: tuple[int | None, ...], token_bytes: int, n_ctx: int) -> int:
    """llama.cpp's K/V cells for one sequence of ``n_ctx``: every global layer ``n_ctx``, a
    sliding one its SWA cache. ``token_bytes``: one token's K and V in one layer (f16)."""
    swa = _pad(min(n_ctx, max(w or 0 for w in windows) + LLAMA_CPP_UBATCH), LLAMA_CPP_SWA_PAD)
    return sum(n_ctx if w is None else swa for w in windows) * token_bytes


def kv_rows(windows: tuple[int | None, ...], default: CachePolicy, slot_bytes: int,
            token_bytes: int, lengths: tuple[int, ...]) -> list[tuple[str, list[int]]]:
    """(system, bytes per sequence at each length). ``windows``: per layer, None for a global
    one; ``slot_bytes``: a snapstream slot of one layer (K, V, position); ``token_bytes``: one
    token's K and V in one layer (in llama.cpp's f16 too: both 2-byte elements)."""
    def snapstream(policy: CachePolicy, length: int) -> int:
        layout = ModelLayout.build(windows, policy.layout(length, 0))
        return layout.num_slots * slot_bytes

    return [
        (f"snapstream, default policy (global budget {default.budget})",
         [snapstream(default, n) for n in lengths]),
        ("snapstream, `full`", [snapstream(CachePolicy(kind="full"), n) for n in lengths]),
        ("llama.cpp SWA cache (f16, n_ctx = prompt)",
         [llama_cpp_kv_bytes(windows, token_bytes, n) for n in lengths]),
        ("full cache, every layer x prompt", [len(windows) * n * token_bytes for n in lengths]),
    ]


def run(args: argparse.Namespace) -> int:
    checkpoint = open_checkpoint(args.model)
    config = checkpoint.config
    token = config.num_kv_heads * 2 * config.head_dim * 2  # K and V in f16
    dtype = getattr(torch, args.kv_dtype)
    row = kv_codec(dtype).row_width(config.head_dim) * dtype.itemsize  # one K (or V) row
    # a slot of every KV head: K and V + snapstream's int32 position (the blob's layout)
    slot = config.num_kv_heads * (kv_slot_bytes(dtype, config.head_dim) + POSITION_BYTES)
    lengths = tuple(n for n in args.lengths if n <= config.max_position_embeddings)
    if not lengths:
        raise SystemExit(f"--lengths: every length exceeds the model's context of "
                         f"{config.max_position_embeddings} tokens")
    default = load_default_policy(checkpoint.policy_file)
    rows = kv_rows(config.attention_windows, default, slot, token, lengths)
    pool = [pool_row_bytes(config, ModelLayout.build(config.attention_windows,
                                                     default.layout(n, 0)), dtype)
            for n in lengths]
    rows.insert(1, ("snapstream decode pool row, default policy (no positions: a slot mask)",
                    pool))
    full, llama_cpp = rows[-1][1], rows[3][1]
    table = markdown_table(
        ["KV bytes per sequence", *(f"{n:,} tokens" for n in lengths)],
        [[name, *(f"{b / 2**20:.1f} MiB ({b / f:.1%})" for b, f in zip(values, full,
                                                                       strict=True))]
         for name, values in rows])
    sliding = len(config.sliding_layers)
    body = (f"{checkpoint.name}: {config.num_layers} layers ({sliding} sliding, window "
            f"{config.sliding_window}), {config.num_kv_heads} KV head(s) of dim "
            f"{config.head_dim}; snapstream's K/V in {args.kv_dtype} ({row} bytes per slot, "
            f"head and K or V) + an int32 position per slot; percentages of the full cache "
            f"(f16, no positions). llama.cpp's cache / snapstream's default: "
            f"{', '.join(f'{c / s:.2f}x' for c, s in zip(llama_cpp, rows[0][1], strict=True))}"
            f" (blob), {', '.join(f'{c / p:.2f}x' for c, p in zip(llama_cpp, pool, strict=True))}"
            f" (decode pool).\n\n{table}\n\n`{command_line()}`")
    publish(body, "kv-bytes", None if args.no_doc else args.doc)
    return 0
