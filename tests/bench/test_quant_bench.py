"""The weight-format benchmark's round-robin timing and its report (no model is loaded)."""

from __future__ import annotations

import json

import torch

from bench.quant_bench import QuantBenchConfig, common_prefix, interleaved
from bench.quant_cli import render


def test_interleaved_steps_every_pair_in_turn_with_its_threads():
    calls = []
    steppers = {(fmt, t): (lambda i, f=fmt: calls.append((f, i, torch.get_num_threads())))
                for fmt in ("a", "b") for t in (1, 2)}
    before = torch.get_num_threads()
    medians = interleaved(steppers, steps=2, warmup=1)
    assert set(medians) == set(steppers)
    assert [c[:2] for c in calls[:4]] == [("a", 0), ("a", 0), ("b", 0), ("b", 0)]
    assert [c[2] for c in calls[:4]] == [1, 2, 1, 2]
    assert torch.get_num_threads() == before


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 5, 3]) == 1


def test_render_reports_ratios_against_the_first_format():
    cfg = QuantBenchConfig(formats=("float32", "int8"), threads=(1,))
    results = {
        "config": json.loads(json.dumps(cfg, default=vars)), "model": "tiny",
        "loadavg": ["1.00 1.00 1.00", "2.00 2.00 2.00"],
        "decode": [{"batch": 1, "context": 1024, "cache": "model", "threads": 1,
                    "format": fmt, "step_s": s} for fmt, s in (("float32", 0.06), ("int8", 0.03))],
        "prefill": [{"format": fmt, "threads": 1, "prefill_s": s, "tokens_per_s": 1024 / s}
                    for fmt, s in (("float32", 2.0), ("int8", 1.6))],
        "rss": {fmt: {"peak_mib": p, "loaded_mib": p, "final_mib": p / 2}
                for fmt, p in (("float32", 1000.0), ("int8", 800.0))},
        "parity": {fmt: {"chat_outputs": [[1, 2]], "first_diff": [d], "identical": int(d == 32),
                         "retrieval_found": [True, f], "forced_top1": t, "forced_kl": k}
                   for fmt, d, f, t, k in (("float32", 32, True, 1.0, 0.0),
                                           ("int8", 5, False, 0.99, 0.002))},
    }
    text = render(results, "python -m bench.quant_bench")
    assert "| 1 | 1024 | model policy (1024 slots) | 1 | 60.00 | 30.00 | 2.00× |" in text
    assert "| 1 | 512 | 640 | 1.25× |" in text  # prefill tok/s and speed
    assert "| int8 | 800 | 400 | 0.80× |" in text
    assert "| int8 | 0/1 | 5 | 1/2 | 0.990 | 0.0020 |" in text
    assert "load average (1, 5, 15 min) 1.00 1.00 1.00 at the start" in text
