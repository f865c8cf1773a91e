"""llama.cpp's perplexity beside the agreement bench: the positions its runner scores, the ratios
and the table. No llama.cpp here: the runner's decode is replaced by a numpy toy model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.blocks_bench import DECODE_PATH, agreement_table, held_out_text
from bench.llamacpp_ppl import llamacpp_agreement, llamacpp_scores
from bench.peers.runners.ppl_llamacpp import ROWS_AT_ONCE, next_token_nll, score_ids

VOCAB = 11


def _toy(ids_seen: list[tuple[list[int], int]]):
    """Logits of a bigram table plus a term of the absolute position: rows scored at the wrong
    position or from the wrong token come out different."""
    rng = np.random.default_rng(0)
    table = rng.normal(size=(VOCAB, VOCAB)).astype(np.float32)  # (V, V)
    by_position = rng.normal(size=(64, VOCAB)).astype(np.float32)  # (positions, V)

    def decode(tokens, n_past):
        ids_seen.append((list(tokens), n_past))
        return table[list(tokens)] + by_position[n_past:n_past + len(tokens)]  # (T, V)

    def reference(ids):  # row i predicts ids[i + 1] from ids[i] at position i
        logits = torch.tensor(table[ids[:-1]] + by_position[:len(ids) - 1])
        lp = logits.double().log_softmax(-1)
        return (-lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]).numpy()

    return decode, reference


@pytest.mark.parametrize("n_batch", [1, 4, 7, 40, 512])
def test_every_position_but_the_last_predicts_the_next_id_once(n_batch):
    ids = np.random.default_rng(1).integers(0, VOCAB, 40).tolist()
    seen: list[tuple[list[int], int]] = []
    decode, reference = _toy(seen)
    got = score_ids(decode, ids, n_batch)
    assert len(got["nll"]) == len(got["top1"]) == len(ids) - 1
    np.testing.assert_allclose(got["nll"], reference(ids), rtol=1e-12)
    # ids[:-1] decoded once, in order, each batch at its own position
    assert [t for tokens, _ in seen for t in tokens] == ids[:-1]
    assert [n_past for _, n_past in seen] == list(range(0, len(ids) - 1, n_batch))


def test_next_token_nll_matches_log_softmax_across_row_chunks():
    rows = 2 * ROWS_AT_ONCE + 5
    logits = np.random.default_rng(2).normal(scale=30, size=(rows, 1000)).astype(np.float32)
    targets = np.random.default_rng(3).integers(0, 1000, rows)
    nll, top1 = next_token_nll(logits, targets)
    lp = torch.tensor(logits).double().log_softmax(-1)
    np.testing.assert_allclose(nll, -lp[torch.arange(rows), torch.tensor(targets)].numpy(),
                               rtol=1e-10)
    np.testing.assert_array_equal(top1, logits.argmax(-1))


def test_fewer_than_two_ids_are_refused():
    with pytest.raises(ValueError, match="at least 2"):
        score_ids(lambda tokens, n_past: np.zeros((len(tokens), VOCAB)), [5], 8)


def test_a_file_that_is_not_gguf_is_reported_missing_without_a_venv(tmp_path):
    model = tmp_path / "config.json"
    model.write_text("{}")
    got = llamacpp_scores(model, [1, 2, 3], n_threads=1)
    assert got == {"missing": f"{model} is not a GGUF file (llama.cpp reads only GGUF)"}


def _engines(nll_f32, nll_gguf):
    nll = {"float32": np.array(nll_f32), "gguf": np.array(nll_gguf)}
    top1 = {"float32": np.array([1, 2, 3]), "gguf": np.array([1, 2, 4])}
    return nll, top1


def test_ratios_against_each_format_and_a_position_mismatch_raises():
    nll, top1 = _engines([1.0, 2.0, 3.0], [1.0, 2.0, 3.3])
    cpp = {"nll": [1.0, 2.0, 3.6], "top1": [1, 0, 4], "settings": {}, "versions": {}}
    got = llamacpp_agreement(cpp, nll, top1)
    assert got["ppl"] == pytest.approx(np.exp(2.2))
    assert got["ppl_vs_float32"] == pytest.approx(np.exp(0.2))
    assert got["ppl_vs_gguf"] == pytest.approx(np.exp(0.1))
    assert got["top1_vs_float32"] == pytest.approx(1 / 3)
    assert got["top1_vs_gguf"] == pytest.approx(2 / 3)
    with pytest.raises(RuntimeError, match="scored 2 positions"):
        llamacpp_agreement({**cpp, "nll": [1.0, 2.0], "top1": [1, 0]}, nll, top1)


def _out(cpp: dict) -> dict:
    return {"tokens": 4, "ppl": {"float32": 10.0, "gguf": 10.1, DECODE_PATH: 10.3},
            "ppl_ratio": {"gguf": 1.01, DECODE_PATH: 1.03},
            "kl": {"gguf": 0.001, DECODE_PATH: None},
            "top1": {"gguf": 0.98, DECODE_PATH: 0.97}, "llama.cpp": cpp}


def test_the_table_has_a_llamacpp_row_or_says_why_not():
    table = agreement_table(_out({"ppl": 10.2, "ppl_vs_float32": 1.02, "ppl_vs_gguf": 1.0099,
                                  "top1_vs_float32": 0.97}))
    row = table.splitlines()[-1].split()
    assert row[:3] == ["llama.cpp", "(same", "GGUF)"]
    assert row[3:] == ["10.200", "1.0200", "1.0099", "97.0%"]
    decode = table.splitlines()[-2].split()
    assert decode[:4] == ["gguf", "decode", "kernels", "(snapstream)"]
    assert decode[4:] == ["10.300", "1.0300", "1.0198", "97.0%"]  # no KL measured: none shown
    assert table.splitlines()[-3].split()[-1] == "0.00100"
    missing = agreement_table(_out({"missing": "not run (--no-llamacpp)"}))
    assert missing.splitlines()[-1].endswith("not measured: not run (--no-llamacpp)")
    assert len(missing.splitlines()) == 5


def test_the_held_out_text_at_a_revision_and_a_bad_revision():
    assert held_out_text("HEAD").startswith("# Architecture")
    with pytest.raises(ValueError, match=r"--text-at no-such-rev: .*give a revision"):
        held_out_text("no-such-rev")
