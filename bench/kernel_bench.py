"""Quantized matmul kernels: ours (snapstream::int4_matmul/int8_matmul) against torch's, by batch.

The model's own linear layers, all of them in turn (their weights come from memory as in a
decode step, not from cache): every block's attention and MLP projections as int4, the LM head
as int8.
Each row of x is what one decoding sequence sends through a step. Three ways, called
round-robin in one process: our kernel on the packed blocks, torch's kernel on the same
quantized weights (``_weight_int4pack_mm_for_cpu``, ``_weight_int8pack_mm``), and oneDNN's
GEMM on the dequantized weight in this CPU's GEMM dtype (bfloat16 where it has bfloat16
instructions, else float32; what prefill uses from ``quant.GEMM_MIN_ROWS`` rows).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bench.quant_bench import interleaved
from bench.report import (
    command_line,
    fmt_ms,
    fmt_ratio,
    machine_line,
    markdown_table,
    parse_ints,
    publish,
)
from serving.settings import add_model_setting
from snapstream.checkpoints import open_checkpoint
from snapstream.cpu import matmul_dtype_name
from snapstream.loader import load_model
from snapstream.quant import Int4Linear, Int8Linear, quantize_int4_groups, quantize_int8_rows

WAYS = ("ours", "torch", "GEMM")


@dataclass(frozen=True)
class KernelBenchConfig:
    rows: tuple[int, ...] = (1, 4, 8, 16, 32, 64, 128, 256)
    calls: int = 10  # medians of this many passes over all layers
    warmup: int = 2
    threads: int = 2



def layer_calls(linears: list[nn.Linear], head: nn.Linear
                ) -> dict[str, dict[str, list[Callable[[torch.Tensor], torch.Tensor]]]]:
    """part ("layers", "head") -> way -> one callable per weight, x (M, K) bfloat16 -> (M, N)."""
    parts: dict[str, dict[str, list]] = {"layers": {w: [] for w in WAYS},
                                         "head": {w: [] for w in WAYS}}
    for linear in linears:
        ours = Int4Linear.from_linear(linear)
        codes = quantize_int4_groups(linear.weight)
        zeros = codes.offsets + 8 * codes.scales  # torch's w = (q - 8) scale + zero
        scale_zeros = torch.stack([codes.scales, zeros], -1).transpose(0, 1).contiguous().to(
            torch.bfloat16)  # (G, N, 2)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            codes.codes.to(torch.int32), 1)
        parts["layers"]["ours"].append(ours.kernel)
        parts["layers"]["torch"].append(
            lambda x, p=packed, sz=scale_zeros: torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, p, 32, sz))
        parts["layers"]["GEMM"].append(
            lambda x, w=ours.gemm_weight: F.linear(x.to(w.dtype), w))
    ours = Int8Linear.from_linear(head)
    codes = quantize_int8_rows(head.weight)
    q, scales = codes.codes, codes.scales[:, 0].to(torch.bfloat16)  # (N, K), (N,)
    parts["head"]["ours"].append(ours.kernel)
    parts["head"]["torch"].append(
        lambda x: torch.ops.aten._weight_int8pack_mm(x, q, scales))
    parts["head"]["GEMM"].append(lambda x, w=ours.gemm_weight: F.linear(x.to(w.dtype), w))
    return parts


def run_kernel_bench(cfg: KernelBenchConfig, path: str | None) -> dict:
    torch.set_num_threads(cfg.threads)
    checkpoint = open_checkpoint(path)
    model = load_model(checkpoint, dtype=torch.float32)
    linears = [child for layer in model.model.layers for block in (layer.self_attn, layer.mlp)
               for child in block.children() if isinstance(child, nn.Linear)]
    head = model.lm_head
    parts = layer_calls(linears, head)
    in_features = {"layers": [x.in_features for x in linears], "head": [head.in_features]}
    del model
    results = []
    for m in cfg.rows:
        inputs = {k: torch.randn(m, k).to(torch.bfloat16) for k in in_features["layers"]}
        for part, ways in parts.items():
            xs = [inputs[k] for k in in_features[part]]  # one input per weight
            medians = interleaved({(way, cfg.threads): lambda i, calls=calls, xs=xs: [
                call(x) for call, x in zip(calls, xs, strict=True)]
                for way, calls in ways.items()}, cfg.calls, cfg.warmup)
            results.append({"rows": m, "part": part,
                            **{way: seconds for (way, _), seconds in medians.items()}})
            print(f"rows {m:4d} {part:6s} " + "  ".join(
                f"{way} {fmt_ms(results[-1][way])} ms" for way in ways), flush=True)
    return {"model": checkpoint.name, "config": asdict(cfg), "linears": len(linears),
            "gemm_dtype": matmul_dtype_name(), "results": results}


def render(results: dict, command: str) -> str:
    table = [[r["rows"], r["part"], *(fmt_ms(r[way]) for way in WAYS),
              fmt_ratio(r["torch"], r["ours"]), fmt_ratio(r["GEMM"], r["ours"])]
             for r in results["results"]]
    return "\n\n".join([
        "### Quantized matmul kernels",
        f"`{command}` — model {results['model']}; {machine_line()}. ms for one pass over the "
        f"model's weights (layers: its {results['linears']} int4 linear layers, fused q/k/v and "
        "gate/up included; head: the int8 LM head), medians of "
        f"{results['config']['calls']} passes, the three ways round-robin; speed-up = their time "
        "/ ours.",
        markdown_table(["rows", "weights", "ours ms", "torch's kernel ms",
                        f"{results['gemm_dtype']} GEMM ms", "vs torch's kernel",
                        f"vs {results['gemm_dtype']} GEMM"], table),
    ])


def register(parser: argparse.ArgumentParser) -> None:
    add_model_setting(parser)
    defaults = KernelBenchConfig()
    parser.add_argument("--rows", type=parse_ints, default=defaults.rows,
                        help="input rows (decoding sequences) per call")
    parser.add_argument("--calls", type=int, default=defaults.calls)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--json-out", type=Path, default=None)


def run(args: argparse.Namespace) -> int:
    cfg = KernelBenchConfig(rows=args.rows, calls=args.calls, threads=args.threads)
    results = run_kernel_bench(cfg, args.model)
    publish(render(results, command_line()), "kernels", args.doc, results, args.json_out)
    return 0
