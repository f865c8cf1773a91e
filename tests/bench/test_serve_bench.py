"""`snapstream bench serve` at toy scale: a real cluster, the in-process engine, a Redis blob."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict

import pytest

from cli.main import main
from snapstream.policy import POLICY_FILE, load_default_policy

pytestmark = pytest.mark.slow


def test_bench_serve_measures_both_systems_and_writes_its_section(tiny_model_dir, tmp_path):
    doc, out = tmp_path / "docs" / "benchmarks.md", tmp_path / "serve.json"
    doc.parent.mkdir()
    doc.write_text("# Benchmarks\n\n<!-- bench:engine -->\nkept\n<!-- /bench:engine -->\n")
    code = main(["bench", "serve", "--model", str(tiny_model_dir), "--concurrency", "1,2",
                 "--requests", "2,2", "--prompt-len", "300", "--max-new-tokens", "8",
                 "--rows", "2", "--rounds", "2", "--warmup", "1", "--stores", "redis",
                 "--blob-stores", "redis",
                 "--blob-sizes-mib", "1", "--blob-repeats", "1", "--doc", str(doc),
                 "--json-out", str(out)])

    assert code == 0
    results = json.loads(out.read_text())
    # no policy asked for: both systems run the model's default, as the router serves it
    default = load_default_policy(tiny_model_dir / POLICY_FILE)
    [serve] = results["serve"]  # one run per store
    assert serve["config"]["policy"] == asdict(default)
    levels = serve["levels"]
    assert [level["concurrency"] for level in levels] == [1, 2]
    for level in levels:
        for system in ("in-process", "router"):
            stats = level[system]
            assert stats["requests"] == 4  # 2 prompts in each of 2 rounds
            assert 4 <= stats["tokens"] <= 32
            assert 0 < stats["ttft_p50_s"] <= stats["ttft_p90_s"] <= stats["ttft_p99_s"]
            assert stats["throughput_tok_s"] > 0
        assert level["identical_outputs"] == 4  # greedy: both systems generate the same tokens
        assert len(level["rounds"]) == 2  # and each round's own figures, for the spread
        for figures in level["rounds"]:
            for system in ("in-process", "router"):
                assert figures[system]["ttft_p50_s"] > 0 < figures[system]["throughput_tok_s"]
        profile = level["router"]["profile"]
        assert profile["mean_s"]["blob_put"] > 0 and profile["mean_s"]["blob_get"] > 0
        for where in ("in-process", "router"):  # both systems time their prefills alike
            means = level[where]["profile"]["mean_s"]
            prefix = "in_process" if where == "in-process" else "worker"
            assert means[f"{prefix}_prefill"] > 0 and means[f"{prefix}_prefill_queue"] >= 0
        assert set(profile["cpu_s"]) == {"store", "prefill", "decode-0", "router", "bench", "other"}
    [blob] = results["blob"]
    assert (blob["store"], blob["size"]) == ("redis", 2**20)
    assert blob["put_s"] > 0 and blob["get_s"] > 0 and math.isfinite(blob["get_s"])
    assert blob["mac_s"] > 0
    text = doc.read_text()
    assert "<!-- bench:engine -->\nkept" in text
    assert "<!-- bench:serve -->" in text and "<!-- /bench:serve -->" in text
    assert "| redis | 1 MiB |" in text and "throughput router / in-process" in text
    assert "### redis store" in text and "load average" in text
    # the router's CPU overhead per token: its processes' CPU minus the in-process engine's
    assert re.search(r"\| 2 \| [+-]\d+\.\d\d \(\d+\.\d\d − \d+\.\d\d\) \| "
                     r"[+-]\d+\.\d\d \([+-]\d+, [+-]\d+\) \|", text)  # per round
    assert (doc.parent / "img" / "serve-redis_latency.png").stat().st_size > 0


def test_bench_serve_compares_the_openai_api_with_grpc_in_its_own_section(tiny_model_dir,
                                                                         tmp_path):
    doc, out = tmp_path / "docs" / "benchmarks.md", tmp_path / "serve.json"
    doc.parent.mkdir()
    doc.write_text("# Benchmarks\n\n<!-- bench:serve -->\nkept\n<!-- /bench:serve -->\n")
    code = main(["bench", "serve", "--parts", "serve", "--systems", "router,openai",
                 "--model", str(tiny_model_dir), "--concurrency", "1,3", "--requests", "2,3",
                 "--prompt-len", "300", "--max-new-tokens", "8", "--rows", "3", "--rounds",
                 "2", "--warmup", "1", "--stores", "nats", "--doc", str(doc),
                 "--json-out", str(out)])

    assert code == 0
    [serve] = json.loads(out.read_text())["serve"]
    assert serve["config"]["store"] == "nats"
    levels = serve["levels"]
    for level, requests in zip(levels, (4, 6), strict=True):
        assert "in-process" not in level
        for system in ("router", "openai"):
            assert level[system]["requests"] == requests
            assert level[system]["ttft_p50_s"] > 0 < level[system]["throughput_tok_s"]
        assert level["identical_outputs"] == requests  # greedy: the same tokens either way
    text = doc.read_text()
    assert "<!-- bench:serve -->\nkept" in text
    assert "<!-- bench:serve-router-openai -->" in text and "ITL p50 / base" in text
    assert "### nats store" in text
    assert (doc.parent / "img" / "serve-router-openai-nats_latency.png").stat().st_size > 0


def test_blob_transfer_goes_with_the_default_systems_only(tmp_path, capsys):
    code = main(["bench", "serve", "--systems", "router,openai", "--doc", str(tmp_path / "b.md")])
    assert code == 2 and "--parts blob goes with the default --systems" in capsys.readouterr().err
    assert not (tmp_path / "b.md").exists()


def test_bench_serve_names_the_stores_it_knows(tmp_path, capsys):
    code = main(["bench", "serve", "--stores", "redis,etcd", "--doc", str(tmp_path / "b.md")])
    assert code == 2 and "--stores: choose from" in capsys.readouterr().err
    assert not (tmp_path / "b.md").exists()


def test_bench_serve_doccache_workload_stores_each_document_once(tiny_model_dir, tmp_path):
    doc, out = tmp_path / "benchmarks.md", tmp_path / "doccache.json"
    code = main(["bench", "serve", "--workload", "doccache", "--parts", "serve",
                 "--model", str(tiny_model_dir), "--documents", "2", "--concurrency", "2",
                 "--requests", "6", "--prompt-len", "500", "--max-new-tokens", "4",
                 "--rows", "2", "--doc", str(doc), "--json-out", str(out)])

    assert code == 0
    [level] = json.loads(out.read_text())["levels"]
    # 2 documents x 3 questions: each document compressed once (single flight), then hit
    assert (level["requests"], level["stored"], level["hit"], level["bypass"]) == (6, 2, 4, 0)
    assert level["hit_rate"] == pytest.approx(4 / 6)
    assert level["bytes_held"] > 0
    assert level["ttft_p50_stored_s"] > 0 and level["ttft_p50_hit_s"] > 0
    text = doc.read_text()
    assert "<!-- bench:serve-doccache -->" in text and "| 2 | 6 | 2 | 2 | 4 | 0 |" in text


def test_the_doccache_workload_runs_through_the_router_only(tmp_path, capsys):
    code = main(["bench", "serve", "--workload", "doccache", "--doc", str(tmp_path / "b.md")])
    assert code == 2 and "--workload doccache measures the router" in capsys.readouterr().err
    assert not (tmp_path / "b.md").exists()
