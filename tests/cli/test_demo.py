"""The demo's report: bytes as served, the decode rate over the tokens it measured."""

from __future__ import annotations

from cli.demo import DemoReport


def test_the_demo_report_measures_decode_over_its_tokens_and_bytes_as_served():
    report = DemoReport(answer="5820.", is_correct=True, prompt_tokens=4000,
                        policy="snapstream 0 + 750 + 250", kept_tokens=1000,
                        kv_bytes_kept=2**20 * 20, kv_bytes_full=2**20 * 80, ttft_s=3.0,
                        decode_tokens=63, decode_s=6.3)
    lines = report.lines()
    assert "10.0 tokens/s over 63 tokens" in lines[-1]
    assert "20.0 MiB kept vs 80.0 MiB" in lines[2] and "4.0x smaller" in lines[2]
    assert "snapstream 0 + 750 + 250" in lines[1] and "25% of the prompt" in lines[1]
