"""Prefill (time to first token in process) in two prompt variants (``VARIANTS``: the prompt's
activation dtype and its attention; by default float32 vs bfloat16 activations, or
``--variants float32,float32-sdpa`` or ``bfloat16-sdpa,bfloat16`` for snapstream's prompt
attention kernel against torch's SDPA): the time split (linear layers / attention / SnapKV
selection / rest), the achieved FLOP/s against the machine's GEMM peak in its GEMM dtype
(``snapstream.cpu.matmul_dtype_name``: bfloat16 where the CPU multiplies it in hardware, else
float32), and the second variant's agreement with the first.

Both variants share one model (one set of weights, one cached GEMM copy in that dtype) and take
turns at each length, so load from other processes falls on both alike.
Run: ``python -m bench.prefill_bench`` (or ``snapstream bench prefill``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bench.limits import GEMM_SHAPES, attended_pairs, gemm_peak, share_of_limit
from bench.peers.prompts import EngineTokenizer, filler_text, passkey_prompt
from bench.report import (
    command_line,
    machine_line,
    markdown_table,
    parse_ints,
    parse_names,
    publish,
)
from snapstream import kernels
from snapstream.cpu import matmul_dtype_name
from snapstream.engine import Engine, PrefillResult
from snapstream.model import Attention
from snapstream.quant import QuantizedLinear


@dataclass(frozen=True)
class PromptVariant:
    dtype: torch.dtype  # the prompt's activations
    kernel: bool = True  # snapstream's prompt attention kernel where it covers; else torch's SDPA


VARIANTS = {
    "float32": PromptVariant(torch.float32),
    "bfloat16": PromptVariant(torch.bfloat16),
    "float32-sdpa": PromptVariant(torch.float32, kernel=False),
    "bfloat16-sdpa": PromptVariant(torch.bfloat16, kernel=False),
}


def _covers_nothing(q: torch.Tensor) -> bool:
    return False


@contextlib.contextmanager
def prompt_attention(variant: PromptVariant) -> Iterator[None]:
    """The model's prompt attention as ``variant`` wants it while the block runs: without the
    kernel, ``kernels.prompt_attention_covers`` answers no, so the model runs torch's SDPA."""
    served = kernels.prompt_attention_covers
    if not variant.kernel:
        kernels.prompt_attention_covers = _covers_nothing
    try:
        yield
    finally:
        kernels.prompt_attention_covers = served


@dataclass(frozen=True)
class PrefillBenchConfig:
    lengths: tuple[int, ...] = (1024, 4096, 8192)
    variants: tuple[str, str] = ("float32", "bfloat16")  # the baseline, then the one compared
    rounds: int = 1
    new_tokens: int = 32  # greedy tokens decoded after each variant's prefill, compared
    dtype: str = "auto"  # the served format; it must quantize the linear layers
    gemm_shapes: tuple[tuple[int, int, int], ...] = GEMM_SHAPES


def prefill_flops(engine: Engine, prompt_len: int) -> tuple[float, float]:
    """(linear, attention) FLOPs of one prompt: 2 per weight per token in the layers, 4 * D per
    query head per (query, key) pair attended (causal; a sliding layer's window). The final
    layer runs its QKV projection for every token (its K/V and SnapKV's window queries) and the
    rest for the last one alone, its attention included (``PrefillRecorder(outputs=1)``), as
    does the LM head."""
    config = engine.config
    layers = engine.model.model.layers
    linear = 0.0
    for idx, layer in enumerate(layers):
        for name, module in layer.named_modules():
            if isinstance(module, (nn.Linear, QuantizedLinear)):
                every = idx < len(layers) - 1 or name == FINAL_LAYER_WHOLE
                linear += 2.0 * _weights(module) * (prompt_len if every else 1)
    *windows, last = config.attention_windows
    pairs = sum(attended_pairs(prompt_len, window) for window in windows) + min(prompt_len,
                                                                         last or prompt_len)
    return linear, 4.0 * config.head_dim * config.num_heads * pairs


FINAL_LAYER_WHOLE = "self_attn.qkv_proj"  # the final layer's one projection of every token


def _weights(module: nn.Module) -> int:
    out_features, in_features = _shape(module)
    return out_features * in_features


def _shape(module: nn.Module) -> tuple[int, int]:
    if isinstance(module, QuantizedLinear):
        return module.out_features, module.in_features
    return tuple(module.weight.shape)


class SplitTimer:
    """Wall time inside the model's linear layers and attention blocks, from forward hooks."""

    def __init__(self, model: nn.Module) -> None:
        self.seconds = {"attn_linear": 0.0, "mlp_linear": 0.0, "attn_block": 0.0}
        self._started: dict[int, float] = {}
        for name, module in model.model.layers.named_modules():
            if isinstance(module, (nn.Linear, QuantizedLinear)):
                self._hook(module, "attn_linear" if "self_attn" in name else "mlp_linear")
            elif isinstance(module, Attention):
                self._hook(module, "attn_block")

    def _hook(self, module: nn.Module, category: str) -> None:
        def pre(mod, _args):
            self._started[id(mod)] = time.perf_counter()

        def post(mod, _args, _out):
            self.seconds[category] += time.perf_counter() - self._started.pop(id(mod))

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)

    def split(self, result: PrefillResult) -> dict[str, float]:
        """The seconds of ``result``'s prefill, the only forward since :meth:`reset`, by part:
        linear layers, attention (RoPE and SDPA), SnapKV selection (scores and compression),
        the rest."""
        s = self.seconds
        linear = s["attn_linear"] + s["mlp_linear"]
        attention = s["attn_block"] - s["attn_linear"] - result.select_s
        rest = result.prefill_s - linear - attention - result.select_s
        return {"total": result.prefill_s, "linear": linear, "attention": attention,
                "select": result.select_s, "rest": rest}


def greedy_after(engine: Engine, result: PrefillResult, prompt_len: int, steps: int
                 ) -> list[int]:
    """``steps`` greedy tokens decoded (batch 1, the static decode step) from ``result``."""
    decoder = engine.new_decoder(result.cache.layout, batch_size=1)
    decoder.cache.insert(0, result.cache)
    tokens = [int(result.logits.argmax())]
    for step in range(steps - 1):
        logits = decoder.step(torch.tensor([tokens[-1]]), torch.tensor([prompt_len + step]))
        tokens.append(int(logits[0].argmax()))
    return tokens


def agreement(ref: PrefillResult, got: PrefillResult) -> dict[str, float]:
    """Logits max |diff|, top-1, and the share of each (layer, KV head)'s kept prompt
    positions that both caches keep (mean and min over them)."""
    overlaps = []
    for a, b in zip(ref.cache.groups, got.cache.groups, strict=True):
        for kept_a, kept_b in zip(a.positions.flatten(0, 1), b.positions.flatten(0, 1),
                                  strict=True):  # (S,) per layer and KV head
            same = len(set(kept_a.tolist()) & set(kept_b.tolist()))
            overlaps.append(same / len(set(kept_a.tolist())))
    return {"logits_max_abs_diff": float((ref.logits - got.logits).abs().max()),
            "logits_max_abs": float(ref.logits.abs().max()),
            "top1_same": bool(ref.logits.argmax() == got.logits.argmax()),
            "kept_overlap_mean": statistics.fmean(overlaps), "kept_overlap_min": min(overlaps)}


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def run_prefill_bench(cfg: PrefillBenchConfig, model: str | None) -> dict:
    load_before = os.getloadavg()
    gemm = gemm_peak(cfg.gemm_shapes)
    served = Engine.from_pretrained(model, dtype=cfg.dtype)
    engines = {name: Engine(served.model, served.tokenizer, default_policy=served.default_policy,
                            name=served.name, kv_dtype=served.kv_dtype,
                            prefill_dtype=VARIANTS[name].dtype)
               for name in cfg.variants}
    timer = SplitTimer(served.model)
    tokenizer = EngineTokenizer(served.tokenizer)
    filler = tokenizer.encode(filler_text())
    for name, engine in engines.items():  # the cached GEMM weights, the kernels' warm-up
        with prompt_attention(VARIANTS[name]):
            engine.prefill(filler[:256], served.default_policy, 1)
    rows = []
    for prompt_len in cfg.lengths:
        ids = list(passkey_prompt(tokenizer, filler, prompt_len).token_ids)
        rows.append(measure_length(engines, timer, ids, cfg))
        print(json.dumps(rows[-1]), flush=True)
    gemm_cache = sum(m.gemm_weight.numel() * m.gemm_weight.element_size()
                     for m in served.model.modules()
                     if isinstance(m, QuantizedLinear) and "gemm_weight" in m.__dict__)
    return {"model": served.name, "policy": repr(served.default_policy),
            "threads": torch.get_num_threads(), "gemm": gemm, "gemm_cache_bytes": gemm_cache,
            "gemm_dtype": matmul_dtype_name(), "variants": list(cfg.variants),
            "loadavg": [load_before, os.getloadavg()], "rows": rows}


def measure_length(engines: dict[str, Engine], timer: SplitTimer, ids: list[int],
                   cfg: PrefillBenchConfig) -> dict:
    """One prompt through every variant, ``cfg.rounds`` times in alternating order: median
    split per variant, the last results' agreement and greedy continuations."""
    splits, results = {name: [] for name in cfg.variants}, {}
    for round_idx in range(cfg.rounds):
        for name in cfg.variants if round_idx % 2 == 0 else cfg.variants[::-1]:
            engine = engines[name]
            timer.reset()
            with prompt_attention(VARIANTS[name]):
                results[name] = engine.prefill(ids, engine.default_policy, cfg.new_tokens)
            splits[name].append(timer.split(results[name]))
    greedy = [greedy_after(engines[name], results[name], len(ids), cfg.new_tokens)
              for name in cfg.variants]
    linear_flops, attention_flops = prefill_flops(engines[cfg.variants[0]], len(ids))
    return {"prompt_tokens": len(ids), "linear_flops": linear_flops,
            "attention_flops": attention_flops,
            "split": {name: _median_split(splits[name]) for name in cfg.variants},
            **agreement(*(results[name] for name in cfg.variants)),
            "greedy_same_prefix": common_prefix(*greedy), "greedy_tokens": cfg.new_tokens}


def _median_split(splits: list[dict[str, float]]) -> dict[str, float]:
    return {part: statistics.median(s[part] for s in splits) for part in splits[0]}


def render(results: dict, command: str) -> str:
    gemm, gemm_dtype = results["gemm"], results["gemm_dtype"]
    peak = max(by_dtype[gemm_dtype] for by_dtype in gemm.values())
    load = " at the start, ".join(" ".join(f"{x:.1f}" for x in avg)
                                  for avg in results["loadavg"]) + " at the end"
    gemm_line = "; ".join(f"{shape}: {d['bfloat16']:.0f} bf16 / {d['float32']:.0f} fp32"
                          for shape, d in gemm.items())
    base_name, other = results["variants"]
    timing, accuracy = [], []
    for row in results["rows"]:
        flops = row["linear_flops"] + row["attention_flops"]
        base = row["split"][base_name]["total"]
        for name, s in row["split"].items():
            rate = flops / s["total"] / 1e9
            share = share_of_limit(s["total"], flops, peak * 1e9)
            timing.append([row["prompt_tokens"], name, f"{s['total']:.2f}",
                           f"{s['total'] / base:.2f}×", f"{s['linear']:.2f}",
                           f"{s['attention']:.2f}", f"{s['select']:.2f}", f"{s['rest']:.2f}",
                           f"{row['linear_flops'] / 1e12:.2f} + "
                           f"{row['attention_flops'] / 1e12:.2f}",
                           f"{rate:.0f}", f"{share:.0%}"])
        accuracy.append([row["prompt_tokens"],
                         f"{row['logits_max_abs_diff']:.3f} (of {row['logits_max_abs']:.1f})",
                         "yes" if row["top1_same"] else "no",
                         f"{100 * row['kept_overlap_mean']:.1f}% / "
                         f"{100 * row['kept_overlap_min']:.1f}%",
                         f"{row['greedy_same_prefix']}/{row['greedy_tokens']}"])
    return "\n\n".join([
        f"## Prefill: {base_name} vs {other} prompts",
        f"Command: `{command}`  \nMachine: {machine_line()}  \nModel: {results['model']}, "
        f"default policy {results['policy']}; passkey prompts (licence texts). One process; "
        "the two variants share the model and take turns at each length; the machine was shared "
        f"with other jobs (load average over 1, 5, 15 min: {load}), so compare ratios within "
        "this run only.",
        f"Plain `torch.mm` GFLOP/s (M x K x N, best of 5): {gemm_line}. This CPU's GEMM dtype "
        f"(the quantized layers' cached GEMM weights): {gemm_dtype}; peak taken as its best "
        f"figure: **{peak:.0f} GFLOP/s**.",
        markdown_table(["prompt tokens", "prompt", "TTFT s", f"/ {base_name}",
                        "linear s", "attention s", "SnapKV s", "rest s",
                        "TFLOP (linear + attention)", "GFLOP/s", "% of GEMM peak"], timing),
        "TTFT: `Engine.prefill` wall time (forward, SnapKV selection and compression, "
        f"next-token logits). Linear: the layers' projections (the cached {gemm_dtype} copy of "
        "the int4/int8 weights through oneDNN's GEMM in both variants, "
        f"{results['gemm_cache_bytes'] / 2**20:.0f} MiB held by a prefill worker); attention: "
        "RoPE and the causal attention (a `-sdpa` variant: torch's SDPA; otherwise "
        "`kernels.prompt_attention`, snapstream's kernel for float32 on AVX-512 CPUs and "
        "bfloat16 on AVX512-BF16 CPUs without AMX, torch's SDPA for the rest); SnapKV: scores "
        "and compression; rest: norms, activations, residuals, dtype conversions, the LM head.",
        f"Agreement of the {other} prompt with the {base_name} one (same weights, same decode "
        "step after it):",
        markdown_table(["prompt tokens", "next-token logits max abs diff", "top-1 same",
                        "kept positions shared (mean / min over layers x KV heads)",
                        "greedy tokens equal (common prefix)"], accuracy),
    ])


def register(parser: argparse.ArgumentParser) -> None:
    defaults = PrefillBenchConfig()
    parser.add_argument("--model", default=None, help="checkpoint (default: SmolLM2)")
    parser.add_argument("--lengths", type=parse_ints, default=defaults.lengths)
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--variants", type=parse_names, default=defaults.variants,
                        help="two of " + ", ".join(VARIANTS) + ": the baseline first "
                        f"(default: {','.join(defaults.variants)})")
    parser.add_argument("--new-tokens", type=int, default=defaults.new_tokens)
    parser.add_argument("--dtype", default=defaults.dtype, choices=("auto", "gguf", "int8", "int4"))
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--no-doc", action="store_true", help="print only")
    parser.add_argument("--json-out", type=Path, default=None)


def run(args: argparse.Namespace, command: str | None = None) -> int:
    """``command``: how the run was invoked, for the doc (default: the snapstream CLI's)."""
    if len(args.variants) != 2 or not set(args.variants) <= set(VARIANTS):
        raise SystemExit(f"--variants: want two of {', '.join(VARIANTS)}, "
                         f"got {','.join(args.variants)}")
    cfg = PrefillBenchConfig(lengths=args.lengths, rounds=args.rounds,
                             new_tokens=args.new_tokens, dtype=args.dtype,
                             variants=tuple(args.variants))
    results = run_prefill_bench(cfg, args.model)
    section = "prefill" if cfg.variants == PrefillBenchConfig.variants else (
        "prefill-" + "-".join(cfg.variants))
    publish(render(results, command or command_line()), section,
            None if args.no_doc else args.doc, results, args.json_out)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    register(parser)
    sys.exit(run(parser.parse_args(),
                 "python -m bench.prefill_bench " + shlex.join(sys.argv[1:])))
