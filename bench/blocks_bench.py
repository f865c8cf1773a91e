"""GGUF blocks served as exact int4/int8 codes (weight format ``gguf``): what it costs and what
it changes, each figure against a baseline measured in the same run.

- ``load``: peak RSS while loading (its growth over the process before loading, VmHWM reset
  at the start) against the served model's bytes, dtype gguf and float32, in a fresh process per
  model: the named models and a synthetic Llama-3.2-1B-shaped Q4_K_M file written here (random
  codes, Q4_K with Q6_K for attn_v/ffn_down and the tied embedding).
- ``decode``: ms per decode step (batches 1 and 16 unless ``--batches``, 1,024 tokens of context
  in the model's default policy) of two source trees (e.g. before and after a change), in fresh
  processes taking turns.
- ``x-bits``: ms per decode step of one model with its int4 layers taking x in 15-bit codes
  and in 8-bit ones (``Int4Linear.x_bits``), in one process taking turns (this VM's bandwidth
  moves between processes more than the difference).
- ``agreement``: dtype gguf against the float32 dequantized model: perplexity, KL and top-1
  agreement teacher-forced over a held-out text (docs shipped in the repo), through the prompt's
  bfloat16 GEMM and through the decode kernels on every row (what a decode step computes: the
  int8 kernel also rounds activations to 8 bits), and greedy parity of
  32 tokens on the 8 chat prompts of ``bench.quant_bench`` (as raw text for a base model);
  llama.cpp's perplexity and top-1 on the same GGUF and the same token ids beside them
  (``bench.llamacpp_ppl``; ``--no-llamacpp`` leaves it out, the table says why it is missing);
  ``--int4-x-bits`` overrides the model's choice of x codes for its int4 layers.

Run: ``python -m bench.blocks_bench {load,decode,x-bits,agreement} [...]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np

from bench.limits import share_of_limit
from bench.report import parse_ints

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
DECODE_PATH = "gguf-decode"  # the gguf model with every row through the decode kernels

LOAD_PEAK = """
import json, sys
from pathlib import Path
import torch
from snapstream.checkpoints import open_checkpoint
from snapstream.loader import load_model
from snapstream.model import Transformer

def status(key):
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(key))
    return int(line.split()[1]) * 1024

checkpoint = open_checkpoint(sys.argv[1])
with torch.device("meta"):  # torch's meta machinery imported once, outside the measure
    Transformer(checkpoint.config)
Path("/proc/self/clear_refs").write_text("5")
before = status("VmRSS:")
model = load_model(checkpoint, keep_blocks=sys.argv[2] == "gguf")
size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
print(json.dumps({"before": before, "peak": status("VmHWM:"), "bytes": size,
                  "file": Path(checkpoint.path).stat().st_size}))
"""


def load_peak(model: str, dtype: str) -> dict[str, int]:
    run = subprocess.run([sys.executable, "-c", LOAD_PEAK, model, dtype], cwd=ROOT, check=True,
                         capture_output=True, text=True)
    return json.loads(run.stdout)


def write_llama_1b_q4_k_m(path: Path, seed: int = 0) -> Path:
    """Llama 3.2 1B's shapes (hidden 2048, 16 layers, 32/8 heads of 64, MLP 8192, vocabulary
    128,256, tied) with random Q4_K/Q6_K blocks whose float16 scales are small and finite."""
    import gguf

    T = gguf.GGMLQuantizationType
    hidden, inner, layers, heads, kv_heads, vocab = 2048, 8192, 16, 32, 8, 128256
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(layers)
    writer.add_context_length(131072)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inner)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    rng = np.random.default_rng(seed)
    shapes = {"attn_q": (hidden, hidden, T.Q4_K), "attn_k": (hidden // 4, hidden, T.Q4_K),
              "attn_v": (hidden // 4, hidden, T.Q6_K), "attn_output": (hidden, hidden, T.Q4_K),
              "ffn_gate": (inner, hidden, T.Q4_K), "ffn_up": (inner, hidden, T.Q4_K),
              "ffn_down": (hidden, inner, T.Q6_K)}
    writer.add_tensor("token_embd.weight", _random_blocks(rng, vocab, hidden, T.Q6_K),
                      raw_dtype=T.Q6_K)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        for name in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{name}.weight", np.ones(hidden, np.float32))
        for name, (rows, cols, kind) in shapes.items():
            writer.add_tensor(f"blk.{i}.{name}.weight", _random_blocks(rng, rows, cols, kind),
                              raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _random_blocks(rng: np.random.Generator, rows: int, cols: int, kind) -> np.ndarray:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[kind]
    data = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)  # d (and dmin): small, finite
    for at in {gguf.GGMLQuantizationType.Q4_K: (0, 2)}.get(kind, (208,)):
        data[:, at:at + 2] = scale
    return data.reshape(rows, -1)


def run_load(models: list[str], synthetic: bool) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if synthetic:
            models = [*models, str(write_llama_1b_q4_k_m(Path(tmp) / "llama-1b-q4_k_m.gguf"))]
        for model in models:
            # the synthetic 1B in float32 would take ~5 GB: its file size is the comparison
            for dtype in ("gguf",) if model.endswith("llama-1b-q4_k_m.gguf") else ("gguf",
                                                                                   "float32"):
                got = load_peak(model, dtype)
                rows.append({"model": Path(model).name, "dtype": dtype, **got,
                             "ratio": (got["peak"] - got["before"]) / got["bytes"]})
    print(f"{'model':32} {'dtype':8} {'file MiB':>9} {'model MiB':>10} {'peak growth MiB':>16} "
          f"{'ratio':>6}")
    for r in rows:
        print(f"{r['model']:32} {r['dtype']:8} {r['file'] / MIB:9.1f} {r['bytes'] / MIB:10.1f} "
              f"{(r['peak'] - r['before']) / MIB:16.1f} {r['ratio']:6.2f}")
    return rows


DECODE_STEPS = """
import json, statistics, sys, time, torch
from bench.engine_bench import ours_stepper
from bench.limits import decode_step_bytes, memory_bandwidth, model_bytes
from snapstream.engine import Engine
from snapstream.kvcache import pool_row_bytes
torch.set_grad_enabled(False)
torch.set_num_threads(int(sys.argv[1]))
engine = Engine.from_pretrained(sys.argv[2] if sys.argv[2] else None)
out, moved = {}, {}
row = pool_row_bytes(engine.config, engine.model_layout(engine.default_policy.layout(1024, 64)),
                     engine.kv_dtype)
for batch in map(int, sys.argv[3].split(",")):
    moved[batch] = decode_step_bytes(model_bytes(engine.model), row, batch)
    layout = engine.default_policy.layout(1024, 64)
    step = ours_stepper(engine.model, layout, batch, 1024, dtype=engine.kv_dtype)
    for i in range(3):
        step(i)
    times = []
    for i in range(3, 33):
        start = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - start)
    out[batch] = statistics.median(times)
print(json.dumps({"step_s": out, "bytes": moved, "bandwidth_gb_s": memory_bandwidth()}))
"""


def run_decode(trees: list[str], rounds: int, threads: int, model: str | None,
               batches: tuple[int, ...]) -> dict[str, dict[str, list[float]]]:
    """Each tree's decode steps of ``model`` (None: the default) at each batch size, ``rounds``
    fresh processes each, in turns, ``threads`` torch threads each."""
    times: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    moved: dict[str, dict[str, int]] = {}
    bandwidth: list[float] = []  # GB/s, measured in each process after its steps
    for _ in range(rounds):
        for tree in trees:
            run = subprocess.run([sys.executable, "-c", DECODE_STEPS, str(threads), model or "",
                                  ",".join(map(str, batches))],
                                 cwd=tree, check=True, capture_output=True, text=True)
            got = json.loads(run.stdout.splitlines()[-1])
            print(f"{tree}: {got}", flush=True)  # each round as it comes
            for batch, seconds in got["step_s"].items():
                times[tree].setdefault(batch, []).append(seconds)
            moved[tree] = got["bytes"]
            bandwidth.append(got["bandwidth_gb_s"])
    base, limit = trees[0], max(bandwidth)
    print(f"memory bandwidth (torch.sum over 1 GiB, best of every process): {limit:.1f} GB/s")
    print(f"{'tree':28} {'batch':>5} {'ms/step (median of rounds)':>27} {'vs first':>9} "
          f"{'MB read/step':>13} {'% of bandwidth':>15}")
    for tree in trees:
        for batch, values in times[tree].items():
            seconds = float(np.median(values))
            ref = float(np.median(times[base][batch]))
            share = share_of_limit(seconds, moved[tree][batch], limit * 1e9)
            print(f"{tree:28} {batch:>5} {seconds * 1e3:27.2f} {seconds / ref:9.3f} "
                  f"{moved[tree][batch] / 1e6:13.1f} {share:15.0%}")
    return times


def run_x_bits(model: str | None, batches: tuple[int, ...], rounds: int,
               threads: int) -> dict[int, dict[int, float]]:
    """Median ms per decode step (1,024 tokens of context in the default policy) at each batch
    with the int4 layers' x in codes of each width, ``rounds`` turns of 5 steps each."""
    import statistics
    import time

    import torch

    from bench.engine_bench import ours_stepper
    from bench.limits import decode_step_bytes, memory_bandwidth, model_bytes
    from bench.report import machine_line
    from snapstream.engine import Engine
    from snapstream.kvcache import pool_row_bytes
    from snapstream.quant import INT4_X_BITS_CHOICES, use_int4_x_bits

    torch.set_grad_enabled(False)
    torch.set_num_threads(threads)
    engine = Engine.from_pretrained(model)
    layout = engine.default_policy.layout(1024, 64)
    row = pool_row_bytes(engine.config, engine.model_layout(layout), engine.kv_dtype)
    times: dict[int, dict[int, float]] = {}
    for batch in batches:
        steppers = {}
        for bits in INT4_X_BITS_CHOICES:  # a decoder's fused layers keep the bits they saw
            use_int4_x_bits(engine.model, bits)
            steppers[bits] = ours_stepper(engine.model, layout, batch, 1024,
                                          dtype=engine.kv_dtype)
            for i in range(3):
                steppers[bits](i)
        seen: dict[int, list[float]] = {bits: [] for bits in steppers}
        for turn in range(rounds):
            for bits, step in steppers.items():
                for i in range(5):
                    start = time.perf_counter()
                    step(3 + 5 * turn + i)
                    seen[bits].append(time.perf_counter() - start)
        times[batch] = {bits: statistics.median(values) for bits, values in seen.items()}
        print(f"batch {batch}: " + ", ".join(f"{bits}-bit {t * 1e3:.1f} ms"
                                             for bits, t in times[batch].items()), flush=True)
    limit = memory_bandwidth()  # GB/s
    print(machine_line())
    print(f"memory bandwidth (torch.sum over 1 GiB, best of 5): {limit:.1f} GB/s")
    print(f"{'batch':>5} {'x bits':>6} {'ms/step (median)':>17} {'vs 15-bit':>9} "
          f"{'% of bandwidth':>15}")
    for batch, by_bits in times.items():
        moved = decode_step_bytes(model_bytes(engine.model), row, batch)
        for bits, seconds in by_bits.items():
            print(f"{batch:>5} {bits:>6} {seconds * 1e3:17.2f} {seconds / by_bits[15]:9.3f} "
                  f"{share_of_limit(seconds, moved, limit * 1e9):15.0%}")
    return times


def held_out_text(revision: str | None) -> str:
    """Three of the project's docs (text the models never saw) as in the working tree, or as
    at git ``revision`` so that a figure can be measured again on the same text."""
    names = ("architecture.md", "benchmarks.md", "accuracy.md")
    if revision is None:
        return "\n\n".join((ROOT / "docs" / name).read_text() for name in names)
    shown = [subprocess.run(["git", "show", f"{revision}:docs/{name}"], cwd=ROOT,
                            capture_output=True, text=True) for name in names]
    if failed := next((run for run in shown if run.returncode != 0), None):
        raise ValueError(f"--text-at {revision}: {failed.stderr.strip()}; give a revision of "
                         "this repository that has these docs")
    return "\n\n".join(run.stdout for run in shown)


def run_agreement(model: str | None, text_tokens: int, chat: bool, kl_positions: int,
                  llamacpp: bool, text_at: str | None, int4_x_bits: int | None) -> dict:
    import torch
    import torch.nn.functional as F

    from bench.llamacpp_ppl import llamacpp_agreement, llamacpp_scores
    from bench.quant_bench import CHAT_PROMPTS, common_prefix, greedy
    from snapstream.chat import ChatMessage
    from snapstream.checkpoints import model_path, open_checkpoint
    from snapstream.engine import Engine
    from snapstream.quant import use_int4_x_bits

    torch.set_grad_enabled(False)
    tokenizer = open_checkpoint(model).tokenizer()
    ids = tokenizer.encode(held_out_text(text_at))[:text_tokens]
    # before the engines load, so that its memory is given back first
    cpp = (llamacpp_scores(model_path(model), ids, torch.get_num_threads()) if llamacpp
           else {"missing": "not run (--no-llamacpp)"})
    engines = {fmt: Engine.from_pretrained(model, dtype=fmt) for fmt in ("float32", "gguf")}
    if int4_x_bits is not None:
        use_int4_x_bits(engines["gguf"].model, int4_x_bits)
    stats = {fmt: _forced(engine, ids, kl_positions) for fmt, engine in engines.items()}
    with mock.patch("snapstream.quant.GEMM_MIN_ROWS", sys.maxsize):  # every row: the kernels
        stats[DECODE_PATH] = _forced(engines["gguf"], ids, kl_positions)
    ref = stats["float32"]
    out = {"tokens": len(ids), "ppl": {f: float(np.exp(s["nll"].mean())) for f, s in stats.items()},
           "kl": {f: float(F.kl_div(stats[f]["logp"], ref["logp"], log_target=True,
                                    reduction="batchmean")) if ref["logp"] is not None else None
                  for f in ("gguf", DECODE_PATH)},
           "top1": {f: float((stats[f]["top1"] == ref["top1"]).float().mean())
                    for f in ("gguf", DECODE_PATH)}}
    out["ppl_ratio"] = {f: out["ppl"][f] / out["ppl"]["float32"] for f in ("gguf", DECODE_PATH)}
    out["llama.cpp"] = llamacpp_agreement(cpp, {f: s["nll"] for f, s in stats.items()},
                                          {f: s["top1"].numpy() for f, s in stats.items()})
    if chat:
        chats = [tokenizer.render_chat([ChatMessage("user", p)]) if tokenizer.chat_template
                 else p for p in CHAT_PROMPTS]  # a base model: the prompts as raw text
        outs = {f: [greedy(e, c, 32) for c in chats] for f, e in engines.items()}
        out["chat_identical"] = sum(a == b for a, b in zip(outs["gguf"], outs["float32"],
                                                           strict=True))
        out["chat_first_diff"] = [common_prefix(a, b) for a, b in
                                  zip(outs["gguf"], outs["float32"], strict=True)]
    print(json.dumps(out, indent=1))
    print(agreement_table(out))
    return out


def agreement_table(out: dict) -> str:
    """The perplexities of :func:`run_agreement`'s ``out`` and their ratios, one row each."""
    ppl, cpp = out["ppl"], out["llama.cpp"]
    lines = [f"{'':33} {'perplexity':>10} {'vs float32':>10} {'vs gguf':>8} "
             f"{'top-1 = float32':>15} {'KL':>8}  ({out['tokens']} tokens)",
             f"{'float32 (snapstream)':33} {ppl['float32']:10.3f} {1:10.4f}"]
    for fmt, name in (("gguf", "gguf prompt GEMM (snapstream)"),
                      (DECODE_PATH, "gguf decode kernels (snapstream)")):
        kl = out["kl"][fmt]
        lines.append(f"{name:33} {ppl[fmt]:10.3f} {out['ppl_ratio'][fmt]:10.4f} "
                     f"{ppl[fmt] / ppl['gguf']:8.4f} {out['top1'][fmt]:15.1%} "
                     f"{'' if kl is None else f'{kl:8.5f}'}")
    if "missing" in cpp:
        return "\n".join([*lines, f"{'llama.cpp (same GGUF)':33} not measured: {cpp['missing']}"])
    return "\n".join([*lines, f"{'llama.cpp (same GGUF)':33} {cpp['ppl']:10.3f} "
                              f"{cpp['ppl_vs_float32']:10.4f} {cpp['ppl_vs_gguf']:8.4f} "
                              f"{cpp['top1_vs_float32']:15.1%}"])


def _forced(engine, ids: list[int], kl_positions: int, rows: int = 256) -> dict:
    """Teacher-forced over ``ids`` (full causal attention): per-position NLL of the next token,
    top-1 ids, and log-probabilities of the first ``kl_positions`` positions for the KL (a
    multiple of ``rows``; (positions, vocabulary) float32 each)."""
    import torch

    model = engine.model
    hidden = model(torch.tensor([ids]), torch.arange(len(ids))[None], model.causal_attend)[0]
    nll, top1, logp = [], [], []
    for start in range(0, len(ids) - 1, rows):
        logits = model.logits(hidden[start:min(start + rows, len(ids) - 1)]).float()
        lp = logits.log_softmax(-1)  # (rows, V)
        target = torch.tensor(ids[start + 1:start + 1 + len(lp)])
        nll.append(-lp[torch.arange(len(lp)), target])
        top1.append(lp.argmax(-1))
        if start < kl_positions:
            logp.append(lp)
    return {"nll": torch.cat(nll).numpy(), "top1": torch.cat(top1),
            "logp": torch.cat(logp) if logp else None}


def main(argv: list[str] | None = None) -> None:
    from snapstream.quant import INT4_X_BITS_CHOICES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    load = sub.add_parser("load")
    load.add_argument("--models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    load.add_argument("--synthetic-1b", action="store_true")
    decode = sub.add_parser("decode")
    decode.add_argument("trees", nargs="+")
    decode.add_argument("--rounds", type=int, default=3)
    decode.add_argument("--threads", type=int, default=2)
    decode.add_argument("--model", default=None, help="a registry name or path (default: the "
                        "default model)")
    decode.add_argument("--batches", type=parse_ints, default=(1, 16),
                        help="comma-separated batch sizes (rows of one decode step)")
    x_bits = sub.add_parser("x-bits")
    x_bits.add_argument("--model", default=None)
    x_bits.add_argument("--batches", type=parse_ints, default=(1, 8))
    x_bits.add_argument("--rounds", type=int, default=8)
    x_bits.add_argument("--threads", type=int, default=2)
    agree = sub.add_parser("agreement")
    agree.add_argument("--model", default=None)
    agree.add_argument("--tokens", type=int, default=4096)
    agree.add_argument("--no-chat", action="store_true")
    agree.add_argument("--text-at", metavar="REV", default=None,
                       help="the held-out docs as at this git revision (default: as checked out)")
    agree.add_argument("--no-llamacpp", action="store_true",
                       help="leave out llama.cpp's perplexity on the same GGUF (otherwise its "
                            "peer venv is built on first use, as `snapstream bench peers` does)")
    agree.add_argument("--kl-positions", type=int, default=1024,
                       help="positions whose distributions are kept for the KL (memory: "
                            "positions x vocabulary x 4 bytes per format)")
    agree.add_argument("--int4-x-bits", type=int, choices=INT4_X_BITS_CHOICES, default=None,
                       help="the width of x's codes in the int4 kernels (default: the model's)")
    args = parser.parse_args(argv)
    if args.what == "load":
        run_load(args.models, args.synthetic_1b)
    elif args.what == "decode":
        run_decode(args.trees, args.rounds, args.threads, args.model, args.batches)
    elif args.what == "x-bits":
        run_x_bits(args.model, args.batches, args.rounds, args.threads)
    else:
        run_agreement(args.model, args.tokens, not args.no_chat, args.kl_positions,
                      not args.no_llamacpp, args.text_at, args.int4_x_bits)


if __name__ == "__main__":
    main()
