"""The peers table, its section in docs/benchmarks.md, and the prompts it is measured on."""

from __future__ import annotations

import pytest

from bench.peers.bench import PeersBenchConfig
from bench.peers.passkey import PeersPasskeyConfig, passkey_set, render_passkey
from bench.peers.peer_model import peer_model
from bench.peers.prompts import filler_text, passkey_prompt
from bench.peers.report import (
    common_prefix,
    memory_table,
    render,
    same_round_ratio,
)
from bench.peers.serve import throughput_table
from bench.report import command_line, write_section


def _point(decode, ttft, tokens, passkey=True):
    return {"decode_ms_per_token": decode, "ttft_ms": ttft, "other_cores_busy": [0.1, 0.5, 0.2],
            "peak_rss_bytes": 300 * 2**20,
            "kv_bytes": 24 * 2**20, "kv_note": "from the shape", "token_ids": tokens,
            "passkey_found": passkey}


def _summary(label, points, failure=None):
    return {"label": label, "points": points, "failure": failure, "venv_build_s": 930.0,
            "load": {"load_s": 1.0, "settings": {"n_ctx": 8192, "flash_attn": False}},
            "hello": {"system": label, "system_info": "AVX = 1 | OPENMP = 1"},
            "venv_versions": ["torch==2.13.0+cpu", "transformers==5.2.0", "rich==13.0"]}


RESULTS = {
    "model": "/x/SmolLM2-135M-Instruct.Q4_1.gguf",
    "prompts": [{"tokens": 1024, "passkey": "12507"}, {"tokens": 4096, "passkey": "97328"}],
    "systems": {
        "llama.cpp": _summary("llama.cpp Q4_1", {
            1024: _point([10.0, 20.0, 10.0], [500.0, 600.0, 550.0], [1, 2, 3, 4]),
            4096: _point([20.0, 40.0, 20.0], [2000.0, 2100.0, 2200.0], [1, 2, 3, 4])}),
        "transformers": _summary("transformers fp32", {
            1024: _point([30.0, 60.0, 30.0], [900.0, 1200.0, 1100.0], [1, 2, 3, 5], False)}),
    },
    "failures": {"openvino": "building the openvino venv failed at 'pip install' (exit 1)"},
    # 100 GB/s and 500 GFLOP/s; 1 GB of weights: 1.024 GB a token is 1% at 1 s, 100% at 10 ms;
    # a full float16 KV of 8 MiB at 1024 tokens (less than the 24 MiB the systems hold: read
    # only where it holds tokens) and 32 MiB at 4096 (more: what they hold is read)
    "limits": {"bandwidth_gb_s": 100.0, "gemm_gflop_s": 500.0, "weights_bytes": 10**9,
               "prompt_flops": {"1024": 2.75e11, "4096": 1.1e12},
               "context_kv_bytes": {"1024": 8 * 2**20, "4096": 32 * 2**20}},
}


def test_same_round_ratios_and_token_agreement():
    # per-round ratios 3, 3, 3 although the rounds' absolute times differ twofold
    assert same_round_ratio([30.0, 60.0, 30.0], [10.0, 20.0, 10.0]) == 3.0
    assert same_round_ratio([1.0], []) is None
    assert common_prefix([1, 2, 3, 4], [1, 2, 3, 5]) == 3
    assert common_prefix([], [1]) == 0


def test_render_writes_one_row_per_measured_point_and_names_failures():
    body = render(RESULTS, PeersBenchConfig(rounds=3), baseline="llama.cpp")
    rows = [line for line in body.splitlines() if line.startswith("| 1024") or
            line.startswith("| 4096")]
    # decode: (1e9 + 8 MiB) bytes in 10 ms at 100 GB/s = 101%, (1e9 + 24 MiB) in 20 ms = 51%;
    # prefill: 2.75e11 FLOPs in 0.55 s at 500 GFLOP/s = 100%
    assert rows == [
        "| 1024 | llama.cpp | 10.0 | 1.00× | 101% | 0.55 | 1.00× | 100% | 300.0 | 24.0 | yes "
        "| 3/4 | 0.2 |",
        "| 1024 | transformers | 30.0 | 3.00× | 34% | 1.10 | 2.00× | 50% | 300.0 | 24.0 | no "
        "| 4/4 | 0.2 |",
        "| 4096 | llama.cpp | 20.0 | 1.00× | 51% | 2.10 | 1.00× | 105% | 300.0 | 24.0 | yes "
        "| — | 0.2 |",
    ]
    assert "memory bandwidth 100.0 GB/s" in body and "peak 500 GFLOP/s" in body
    assert "Command: `snapstream " in body
    assert "torch==2.13.0+cpu, transformers==5.2.0 (built in 15.5 min)" in body
    assert "rich" not in body
    assert "Settings: n_ctx = 8192; flash_attn = False; system_info = AVX = 1 | OPENMP = 1" in body
    assert "**openvino**: not measured: building the openvino venv failed" in body


def test_a_system_kept_to_shorter_prompts_gets_a_row_saying_so():
    results = {**RESULTS, "max_lengths": {"transformers": 2048}}
    body = render(results, PeersBenchConfig(rounds=3), baseline="llama.cpp")
    row = next(line for line in body.splitlines() if line.startswith("| 4096 | transformers"))
    assert "not run: prompts over 2048 tokens are too slow or too big" in row
    assert row.count("|") == body.splitlines()[body.splitlines().index(row) - 1].count("|")


def test_the_peers_section_replaces_itself_and_keeps_the_others(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n<!-- bench:engine -->\nengine figures\n"
                   "<!-- /bench:engine -->\n")
    body = render(RESULTS, PeersBenchConfig(), baseline="llama.cpp")
    write_section(doc, "peers", "old figures")
    write_section(doc, "peers", body)
    text = doc.read_text()
    assert "engine figures" in text and "old figures" not in text
    assert text.count("<!-- bench:peers -->") == 1 and text.count("<!-- /bench:peers -->") == 1
    assert "| 1024 | llama.cpp | 10.0 |" in text


def test_figures_with_the_kernels_capped_go_to_a_section_of_their_own(monkeypatch):
    """SNAPSTREAM_KERNELS=avx2 on an AVX-512 machine measures another kind of CPU: its tables
    sit beside this machine's own, and their heading says so."""
    assert peer_model().section() == "peers"
    assert "capped" not in render(RESULTS, PeersBenchConfig(), baseline="llama.cpp")
    monkeypatch.setenv("SNAPSTREAM_KERNELS", "avx2")
    assert (peer_model().section(), peer_model("gemma3-270m").section("passkey"),
            peer_model("qwen2.5-coder-1.5b").section()) == (
        "peers-avx2", "peers-gemma3-270m-avx2-passkey", "peers-qwen2.5-coder-1.5b-avx2")
    heading = render(RESULTS, PeersBenchConfig(), baseline="llama.cpp").splitlines()[0]
    assert heading.endswith("kernels capped at avx2 (SNAPSTREAM_KERNELS=avx2)")


class CharTokenizer:
    """One id per character: enough to check how prompts are put together."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids)

    def start_ids(self) -> list[int]:
        return []


def test_passkey_prompt_has_the_exact_length_and_the_passkey_at_its_depth():
    tok = CharTokenizer()
    filler = tok.encode(filler_text())
    prompt = passkey_prompt(tok, filler, 3000, depth=0.5)
    text = tok.decode(prompt.token_ids)
    assert len(prompt.token_ids) == 3000
    assert text.endswith("What is the pass key? The pass key is")
    assert 0.4 < text.index(f"The pass key is {prompt.passkey}.") / len(text) < 0.6
    assert passkey_prompt(tok, filler, 3000) == prompt  # deterministic
    assert passkey_prompt(tok, filler, 3001).passkey != prompt.passkey
    with pytest.raises(ValueError, match="filler"):
        passkey_prompt(tok, filler[:100], 3000)


class BosCharTokenizer(CharTokenizer):
    """A model that asks for a BOS id (Gemma 3) before any text."""

    def start_ids(self) -> list[int]:
        return [2]


def test_a_model_with_bos_gets_it_first_within_the_prompt_length():
    tok = BosCharTokenizer()
    filler = tok.encode(filler_text())
    prompt = passkey_prompt(tok, filler, 3000)
    assert len(prompt.token_ids) == 3000 and prompt.token_ids[0] == 2
    assert prompt.token_ids[1:1001] == tuple(filler[:1000])  # then the text as before
    assert f"The pass key is {prompt.passkey}." in tok.decode(prompt.token_ids)
    assert tok.decode(prompt.token_ids).endswith("What is the pass key? The pass key is")


def test_the_passkey_set_has_a_key_and_a_depth_per_prompt():
    tok = CharTokenizer()
    cfg = PeersPasskeyConfig(systems=("snapstream",), prompts=8, prompt_len=3000)
    prompts = passkey_set(tok, cfg)
    assert len({p.passkey for p in prompts}) == 8 and {len(p.token_ids) for p in prompts} == {3000}
    depths = [tok.decode(p.token_ids).index(f"The pass key is {p.passkey}.") / 3000
              for p in prompts]
    assert depths == sorted(depths) and depths[0] < 0.1 and depths[-1] > 0.85


def test_the_passkey_table_counts_answers_and_shows_the_misses():
    cfg = PeersPasskeyConfig(systems=("snapstream", "transformers"), prompts=2)
    results = {"systems": {
        "snapstream": {"label": "s", "answers": [{"passkey": "1", "text": " 1.", "found": True},
                                                 {"passkey": "2", "text": " 2.", "found": True}]},
        "transformers": {"label": "t", "answers": [
            {"passkey": "1", "text": " 1.", "found": True},
            {"passkey": "2", "text": " 7 is it", "found": False}]}},
        "failures": {"kvpress-snapkv": "venv build failed"}}
    body = render_passkey(results, cfg, "snapstream bench peers --parts passkey")
    assert "Command: `snapstream bench peers --parts passkey`" in body
    assert "| snapstream | 2/2 | - |" in body
    assert "| transformers | 1/2 | '7 is it' |" in body
    assert "- kvpress-snapkv: venv build failed" in body


def test_memory_table_counts_sequences_in_4_gib_at_the_longest_prompt():
    results = {**RESULTS, "systems": {
        "llama.cpp": RESULTS["systems"]["llama.cpp"],
        "snapstream": _summary("snapstream", {4096: {**_point([5.0], [1.0], [1]),
                                                      "kv_bytes": 3 * 2**20}})}}
    rows = [line for line in memory_table(results, "llama.cpp").splitlines()
            if line.startswith("| ") and "MiB" not in line]
    assert rows == ["| llama.cpp | 24.0 | 1.0× | 170 | 300.0 |",
                    "| snapstream | 3.0 | 8.0× | 1365 | 300.0 |"]


def test_throughput_table_takes_the_ratio_within_each_round():
    def figures(tok_s):
        return {"throughput_tok_s": tok_s, "ttft_p50_s": 2.0, "itl_p50_s": 0.05}

    serve = {"levels": [{"concurrency": 4, "in-process": figures(30.0), "openai": figures(20.0),
                         "rounds": [{"in-process": figures(30.0), "openai": figures(20.0)},
                                    {"in-process": figures(20.0), "openai": figures(40.0)}]}]}
    rows = [line for line in throughput_table(serve).splitlines() if line.startswith("| 4")]
    assert rows == ["| 4 | snapstream | 30.0 | 1.50×, 0.50× | 2.00 | 50 |",
                    "| 4 | llama-server | 20.0 |  | 2.00 | 50 |"]


def test_a_command_line_names_the_variables_that_change_the_measurement(monkeypatch):
    monkeypatch.setattr("sys.argv", ["snapstream", "bench", "peers", "--lengths", "1024"])
    for name in ("SNAPSTREAM_KERNELS", "SNAPSTREAM_MATMUL_DTYPE", "ATEN_CPU_CAPABILITY",
                 "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.delenv(name, raising=False)
    assert command_line() == "snapstream bench peers --lengths 1024"
    monkeypatch.setenv("SNAPSTREAM_KERNELS", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("HOME", "/elsewhere")  # not one that changes a figure
    assert command_line() == ("SNAPSTREAM_KERNELS=avx2 ONEDNN_MAX_CPU_ISA=AVX2 snapstream "
                              "bench peers --lengths 1024")


def test_a_command_line_leaves_out_where_the_results_go(monkeypatch):
    monkeypatch.delenv("SNAPSTREAM_KERNELS", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr("sys.argv", ["snapstream", "bench", "flat", "--doc", "/tmp/x.md",
                                     "--rounds", "5", "--json-out=/tmp/x.json", "--no-doc"])
    assert command_line() == "snapstream bench flat --rounds 5 --no-doc"


def test_the_machines_limits_come_with_the_gguf_and_each_prompts_flops(monkeypatch):
    import bench.peers.bench as peers_bench
    from bench.limits import prompt_flops
    from snapstream.checkpoints import open_checkpoint

    monkeypatch.setattr(peers_bench, "memory_bandwidth", lambda: 42.0)
    monkeypatch.setattr(peers_bench, "gemm_peak", lambda: {"a": {"float32": 90.0,
                                                                 "bfloat16": 300.0},
                                                           "b": {"float32": 100.0,
                                                                 "bfloat16": 250.0}})
    model = peer_model("smollm2-135m")
    limits = peers_bench.machine_limits(model, [1024, 4096], lambda message: None)
    config = open_checkpoint(model.gguf).config
    assert limits["bandwidth_gb_s"] == 42.0 and limits["gemm_gflop_s"] == 300.0
    assert limits["weights_bytes"] == model.gguf.stat().st_size
    assert limits["prompt_flops"] == {"1024": prompt_flops(config, 1024),
                                      "4096": prompt_flops(config, 4096)}
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims, K and V in float16: 23,040 bytes a token
    assert limits["context_kv_bytes"] == {"1024": 1024 * 23_040, "4096": 4096 * 23_040}
    # SmolLM2-135M: ~2 x 135M x 0.8 FLOPs a token besides attention
    assert 1.5e8 < limits["prompt_flops"]["1024"] / 1024 < 3e8


def test_a_full_cache_is_read_up_to_the_windows_of_its_layers():
    """A Gemma 3 in miniature: 4 of its 5 layers see at most 16 tokens, so 100 tokens of
    context are read in full only by the global one."""
    from bench.limits import context_kv_bytes
    from tests.tiny_models import tiny_gemma3_config

    config = tiny_gemma3_config()
    per_layer_token = 2 * config.num_kv_heads * config.head_dim * 2  # K and V, float16
    assert context_kv_bytes(config, 100) == per_layer_token * (100 + 4 * 16)
    assert context_kv_bytes(config, 10) == per_layer_token * 5 * 10
