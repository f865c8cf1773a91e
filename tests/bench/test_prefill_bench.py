"""The prefill benchmark's FLOP count, time split and report, on a tiny int8 model."""

from __future__ import annotations

import json

import pytest
import torch

from bench.prefill_bench import (
    VARIANTS,
    PrefillBenchConfig,
    render,
    run_prefill_bench,
)
from snapstream import kernels
from snapstream.engine import Engine


@pytest.fixture(scope="module", params=[("float32", "bfloat16"), ("float32", "float32-sdpa")],
                ids=["dtypes", "attention"])
def results(request, tiny_model_dir) -> dict:
    cfg = PrefillBenchConfig(lengths=(200, 210), new_tokens=3, dtype="int8",
                             gemm_shapes=((64, 32, 48),), variants=request.param)
    return run_prefill_bench(cfg, str(tiny_model_dir))


def test_the_split_adds_up_and_the_flops_count_every_layer(results, tiny_model_dir):
    row = results["rows"][0]
    config = Engine.from_pretrained(tiny_model_dir).config
    hidden, inner = config.hidden_size, config.intermediate_size
    q_dim, kv_dim = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    qkv = hidden * (q_dim + 2 * kv_dim)
    weights = qkv + q_dim * hidden + 3 * hidden * inner
    # the final layer: QKV for every token, the rest (attention included) for the last one
    final = 2 * 200 * qkv + 2 * (weights - qkv)
    assert row["linear_flops"] == 2 * 200 * (config.num_layers - 1) * weights + final
    assert row["attention_flops"] == (4 * config.head_dim * config.num_heads
                                      * ((config.num_layers - 1) * 200 * 201 // 2 + 200))
    for split in (s for later in results["rows"] for s in later["split"].values()):
        # only the prefill timed: not the greedy decode after the previous length's
        assert 0 < split["linear"] < split["total"] and 0 < split["attention"] < split["total"]
        assert 0 <= split["rest"] < split["total"]
        parts = split["linear"] + split["attention"] + split["select"] + split["rest"]
        assert parts == pytest.approx(split["total"])
    assert set(row["split"]) == set(results["variants"])
    width = {"bfloat16": 2, "float32": 4}[results["gemm_dtype"]]  # the CPU's GEMM dtype
    assert results["gemm_cache_bytes"] == width * ((config.num_layers - 1) * weights + qkv)
    assert 0 < row["kept_overlap_min"] <= row["kept_overlap_mean"] <= 1
    assert 0 <= row["greedy_same_prefix"] <= 3


@pytest.mark.parametrize(("gemm_dtype", "peak"), [("bfloat16", 400), ("float32", 100)])
def test_the_report_gives_ratios_and_the_share_of_the_peak(results, gemm_dtype, peak):
    row = json.loads(json.dumps(results["rows"][0]))
    results = {**results, "gemm": {"64x32x48": {"float32": 100.0, "bfloat16": 400.0}},
               "rows": [row], "gemm_dtype": gemm_dtype}
    base, other = results["variants"]
    row["split"][base]["total"], row["split"][other]["total"] = 4.0, 1.0
    text = render(results, "python -m bench.prefill_bench")
    assert f"## Prefill: {base} vs {other} prompts" in text
    flops = row["linear_flops"] + row["attention_flops"]
    assert "Command: `python -m bench.prefill_bench`" in text
    load = " ".join(f"{x:.1f}" for x in results["loadavg"][0])
    assert f"(load average over 1, 5, 15 min: {load} at the start, " in text
    assert f"GEMM dtype (the quantized layers' cached GEMM weights): {gemm_dtype}" in text
    assert f"**{peak} GFLOP/s**" in text
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| 200 | {other} | 1.00 |"))
    assert line.split(" | ")[3] == "0.25×"
    assert line.split(" | ")[9:] == [f"{flops / 1e9:.0f}", f"{100 * flops / 1e9 / peak:.0f}% |"]


def test_the_model_gets_the_compiled_attention_back_and_its_variants_agree(results):
    """A variant's attention is swapped in for its prefills only; two implementations of the
    same float32 attention pick the same next tokens."""
    assert kernels.prompt_attention_covers is torch.ops.snapstream.prompt_attention_covers
    base, other = (VARIANTS[name] for name in results["variants"])
    assert all(row["top1_same"] for row in results["rows"]) or base.dtype != other.dtype
