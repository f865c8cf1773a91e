"""`snapstream sim`, in process through the real CLI registry."""

import json

import pytest

from cli.main import main

LLAMA_8B_TABLE = ["sim", "--model", "llama-3.1-8b", "--sockets", "1", "--batch", "1",
                  "--context", "4096", "--policy", "full"]


def test_text_report(capsys):
    assert main(LLAMA_8B_TABLE) == 0
    out = capsys.readouterr().out
    assert "llama-3.1-8b (8.03B params) on 1 x SN40L" in out
    assert "weights       14.96 GiB   kv cache 0.50 GiB" in out
    assert "tokens/s" in out
    assert "hbm 15.46 GiB / 64.00 GiB" in out


def test_json_report_fields(capsys):
    assert main([*LLAMA_8B_TABLE, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["weight_bytes"] == 2 * 8_030_261_248
    assert report["kv_cache_bytes"] == 1 << 29
    # weights read: 13,959,168,000 layers + 8,192 embedding row + 1,050,681,344 head;
    # KV: 536,870,912 read + 131,072 written
    assert report["bytes_per_step"] == 15_009_857_536 + 536_870_912 + 131_072
    assert report["flops_per_step"] == 17_156_800_512
    assert report["tokens_per_s"] == pytest.approx(1 / report["step_time_s"])
    assert report["tokens_per_s_per_user"] == report["tokens_per_s"]
    assert report["kernel_calls"] == 2  # one looped call for the 32 layers, one for the head
    assert set(report["memory"]) == {"sram", "hbm", "ddr"}
    assert report["fits"] is True
    assert report["error"] is None


def test_does_not_fit_json_exits_3(capsys):
    argv = ["sim", "--model", "deepseek-v3", "--sockets", "16", "--batch", "64", "--context",
            "131072", "--policy", "full", "--json"]
    assert main(argv) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["fits"] is False
    assert report["step_time_s"] is None
    assert report["error"].startswith("does not fit: HBM short by")
    missing = (report["memory"]["hbm"] - report["memory_capacity"]["hbm"]) / (1 << 30)
    assert f"HBM short by {missing:.2f} GiB per socket" in report["error"]


def test_does_not_fit_text_names_tier(capsys):
    argv = ["sim", "--model", "deepseek-v3", "--batch", "64", "--context", "131072",
            "--policy", "full"]
    assert main(argv) == 3
    captured = capsys.readouterr()
    assert "step time     - (does not fit)" in captured.out
    assert "error: does not fit: HBM short by" in captured.err


def test_snapstream_fits_where_full_does_not(capsys):
    argv = ["sim", "--model", "deepseek-v3", "--dtype", "fp8", "--kv-dtype", "bf16",
            "--batch", "8", "--context", "131072", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"] == "snapstream"
    assert report["budget"] == report["cache_tokens"] == 32768
    assert main([*argv, "--policy", "full"]) == 3


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model", "no-such-model"], "not a shipped target"),
        (["--model", "llama-3.1-8b", "--batch", "0"], "batch must be an integer >= 1"),
        (["--model", "llama-3.1-8b", "--sockets", "-2"], "sockets must be >= 1"),
        (["--model", "llama-3.1-8b", "--context", "0"], "context must be an integer >= 1"),
        (["--model", "llama-3.1-8b", "--n-recent", "0"], "n_recent must be >= 1"),
        (["--model", "llama-3.1-8b", "--hbm-bandwidth-gbs", "-1"], "hbm_bandwidth must be > 0"),
        (["--model", "llama-3.1-8b", "--dtype", "int4"], "invalid choice: 'int4'"),
        (["--model", "llama-3.1-8b", "--batch", "two"], "invalid int value: 'two'"),
    ],
)
def test_invalid_input_one_line_exit_2(capsys, flags, message):
    assert main(["sim", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_hardware_override_changes_step_time(capsys):
    main([*LLAMA_8B_TABLE, "--json"])
    base = json.loads(capsys.readouterr().out)["time_breakdown_s"]
    main([*LLAMA_8B_TABLE, "--json", "--hbm-bandwidth-gbs", "1000"])  # half the default
    slow = json.loads(capsys.readouterr().out)["time_breakdown_s"]
    assert slow["hbm"] == pytest.approx(2 * base["hbm"])
    assert slow["compute"] == base["compute"]


def test_sweep_writes_plots(capsys, tmp_path):
    argv = ["sim", "--model", "llama-3.1-8b", "--sockets", "8", "--batch", "4",
            "--contexts", "1024,65536", "--n-topk", "1020", "--n-recent", "1024",
            "--sweep", str(tmp_path), "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert [(r["policy"], r["context"]) for r in result["rows"]] == [
        ("full", 1024), ("full", 65536), ("snapstream", 1024), ("snapstream", 65536)]
    snap = [r for r in result["rows"] if r["policy"] == "snapstream"]
    assert snap[0]["tokens_per_s"] == snap[1]["tokens_per_s"]  # fixed size: flat in context
    for path in result["plots"]:
        assert (tmp_path / path.rsplit("/", 1)[1]).read_bytes()[:4] == b"\x89PNG"
