"""The demo's report: bytes as served, the decode rate over the tokens it measured."""

from __future__ import annotations

from cli.demo import DemoReport, served_kv_dtype
from snapstream.checkpoints import open_checkpoint


def test_the_demo_report_measures_decode_over_its_tokens_and_bytes_as_served():
    report = DemoReport(answer="5820.", is_correct=True, prompt_tokens=4000,
                        policy="snapstream 0 + 750 + 250", kept_tokens=1000,
                        kv_dtype="int8", kv_bytes_kept=2**20 * 20, kv_bytes_full=2**20 * 80,
                        ttft_s=3.0,
                        decode_tokens=63, decode_s=6.3)
    lines = report.lines()
    assert "10.0 tokens/s over 63 tokens" in lines[-1]
    assert "20.0 MiB kept vs 80.0 MiB" in lines[2] and "4.0x smaller" in lines[2]
    assert "K/V in int8" in lines[2]  # the dtype the workers serve, not float32
    assert "snapstream 0 + 750 + 250" in lines[1] and "25% of the prompt" in lines[1]


def test_the_demo_names_the_kv_dtype_the_workers_serve(tiny_model_dir):
    gguf = open_checkpoint(None)  # SmolLM2's GGUF, served with an int8 KV cache
    assert served_kv_dtype(gguf, None) == "int8"
    assert served_kv_dtype(gguf, "bfloat16") == "bfloat16"
    assert served_kv_dtype(open_checkpoint(tiny_model_dir), None) == "float32"
