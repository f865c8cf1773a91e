"""The decode-against-context benchmark's config and report, on results with known answers."""

from __future__ import annotations

import pytest

from bench.flat_bench import FlatBenchConfig, render


def test_config_wants_two_lengths_and_steps_to_time():
    with pytest.raises(ValueError, match="two or more"):
        FlatBenchConfig(lengths=(1024,))
    with pytest.raises(ValueError, match="tokens"):
        FlatBenchConfig(tokens=1)


def test_report_gives_each_length_its_median_against_the_first_and_its_share_of_bandwidth():
    cfg = FlatBenchConfig(lengths=(1000, 30000), rounds=3)
    results = {"model": "M", "lengths": [1000, 30000], "kv_row_bytes": 2**20,
               "medians_s": {1000: [0.050, 0.040, 0.045], 30000: [0.046, 0.060, 0.0495]},
               "step_bytes": 10**9, "bandwidth_gb_s": 40.0}
    table = render(results, cfg).splitlines()
    first = next(line for line in table if line.startswith("| 1000 |"))
    last = next(line for line in table if line.startswith("| 30000 |"))
    assert first.split(" | ")[1:3] == ["45.0", "1.000x"]
    # median 49.5 ms over 45.0: 1.1x; 1 GB in 49.5 ms against 40 GB/s: 51%
    assert last.split(" | ")[1:3] == ["49.5", "1.100x"] and last.endswith("| 51% |")
