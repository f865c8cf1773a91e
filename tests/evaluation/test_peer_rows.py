"""A peer system in the grid, through `snapstream eval --peers`: snapstream's own peer runner
(this interpreter, no venv to build) on a tiny GGUF checkpoint answers every sample at every
budget, scored like the grid's rows."""

import contextlib
import csv
import io

import pytest

from cli.main import main
from evaluation.config import EvalConfig
from tests.tiny_models import random_model, tiny_config, write_gguf


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    config = tiny_config(max_position_embeddings=1024)
    return write_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", random_model(config), {})


def test_a_peer_answers_every_sample_at_every_budget(gguf_model, tmp_path):
    args = ["eval", "--model", str(gguf_model), "--tasks", "niah", "--context-lens", "600",
            "--placements", "after", "--policies", "full,snapstream", "--budgets", "1/4,1/2",
            "--n-per-cell", "2", "--peers", "snapstream-full", "--peer-threads", "1",
            "--max-group-tokens", "1500", "--no-progress", "--out", str(tmp_path)]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args) == 0
    with (tmp_path / "results.csv").open(newline="") as file:
        records = list(csv.DictReader(file))
    peers = [r for r in records if r["policy"] == "snapstream-full"]
    assert sorted((r["sample"], r["budget_label"]) for r in peers) == [
        ("0", "1/2"), ("0", "1/4"), ("1", "1/2"), ("1", "1/4")]
    full = {r["sample"]: r for r in records if r["policy"] == "full"}
    for peer in peers:
        # the full cache either way: the peer's greedy text goes on where the grid's stopped
        assert peer["generated"].startswith(full[peer["sample"]]["generated"])
        assert int(peer["budget"]) == {"1/4": 150, "1/2": 300}[peer["budget_label"]]
        assert peer["needle_kept"] == ""  # no analysis of a peer's cache


def test_peers_must_be_known_systems_and_answer_without_a_gap():
    with pytest.raises(ValueError, match="peers"):
        EvalConfig(peers=("vllm",))
    with pytest.raises(ValueError, match="gaps=0"):
        EvalConfig(peers=("openvino-evict",), placements=("after",), gaps=(0, 64))
