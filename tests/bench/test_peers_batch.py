"""The batch part's decode window and its figures, on stamps with known answers."""

from __future__ import annotations

import pytest

from bench.peers.batch import PeersBatchConfig, batch_figures, batch_table, decode_window
from bench.peers.prompts import Prompt


def test_window_runs_from_the_last_first_token_to_the_first_last_token():
    stamps = [[1.0, 2.0, 3.0, 4.0, 5.0],  # started first, finished first
              [2.5, 3.0, 4.0, 5.0, 6.0]]
    window = decode_window(stamps)
    # (2.5, 5.0]: row 0 gives 3, 4, 5; row 1 gives 3, 4, 5 (its first token at 2.5 is not in)
    assert window == {"window_s": 2.5, "tokens": 6, "tok_s": 6 / 2.5}


def test_a_sequence_done_before_another_starts_leaves_no_window():
    assert decode_window([[0.0, 0.5, 1.0], [2.0, 2.5, 3.0]]) == {
        "window_s": 0.0, "tokens": 0, "tok_s": None}


def test_lockstep_rows_give_rows_times_steps_over_the_decode_time():
    steps = [10.0 + 0.1 * i for i in range(1, 9)]
    stamps = [[9.0, *steps], [9.5, *steps], [10.0, *steps]]
    window = decode_window(stamps)
    assert window["tokens"] == 3 * 8
    assert window["tok_s"] == pytest.approx(3 * 8 / 0.8)


class _Echo:
    def decode(self, ids):
        return " ".join(map(str, ids))


def test_figures_count_passkeys_and_rates():
    prompts = [Prompt("a", (1, 2), "7"), Prompt("b", (3, 4), "9")]
    reply = {"stamps_s": [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], "token_ids": [[7, 1, 1], [1, 1, 1]],
             "kv_bytes": 10, "kv_note": "n", "peak_rss_bytes": 5, "extra": {},
             "other_cores_busy": 0.25}
    figures = batch_figures(reply, prompts, _Echo())
    assert figures["passkeys_found"] == 1 and figures["other_cores_busy"] == 0.25
    assert figures["total_tok_s"] == 6 / 3.0 and figures["tok_s"] == 4 / 2.0
    assert figures["ttft_p50_s"] == 1.0


def test_config_refuses_what_cannot_be_measured():
    with pytest.raises(ValueError, match="unknown peer system"):
        PeersBatchConfig(systems=("nope",))
    with pytest.raises(ValueError, match="max_new_tokens"):
        PeersBatchConfig(max_new_tokens=2)


def test_table_gives_each_round_its_ratio_and_its_neighbours_load():
    def run(rate, busy):
        return {"tok_s": rate, "window_s": 2.0, "tokens": 2 * rate, "ttft_p50_s": 1.0,
                "total_tok_s": rate / 2, "kv_bytes": 2**20, "peak_rss_bytes": 2**30,
                "passkeys_found": 2, "other_cores_busy": busy}
    results = {"results": {"a": {2: [run(10.0, 0.0), run(10.0, 0.54)]},
                           "b": {2: [run(15.0, 0.03), run(30.0, 1.2)]}}}
    table = batch_table(results, "a")
    row_a = next(line for line in table.splitlines() if "| a |" in line)
    row_b = next(line for line in table.splitlines() if "| b |" in line)
    assert "1.50×, 3.00×" in row_b and row_b.rstrip().endswith("| 0.0, 1.2 |")
    assert row_a.rstrip().endswith("| 0.0, 0.5 |")
