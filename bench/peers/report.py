"""The peers table (markdown) from ``run_peers_bench``'s results."""

from __future__ import annotations

import os

from bench.limits import share_of_limit
from bench.peers.bench import PeersBenchConfig
from bench.peers.peer_model import peer_model
from bench.peers.runners.peer_protocol import median
from bench.report import command_line, machine_line, markdown_table
from snapstream.cpu import kernel_cap_name

REFERENCE = "transformers"  # the full-cache fp32 outputs other systems' tokens are compared with
KEY_PACKAGES = ("llama_cpp_python", "openvino", "openvino-genai", "openvino-tokenizers",
                "optimum-intel", "torch", "transformers", "kvpress", "numpy")


def capped_title() -> str:
    """What a heading adds when SNAPSTREAM_KERNELS forces another kind of CPU's kernels (and
    llama.cpp's build, bench/peers/recipes.py) on this one."""
    cap = kernel_cap_name()
    return "" if cap == "native" else f", kernels capped at {cap} (SNAPSTREAM_KERNELS={cap})"


def same_round_ratio(values: list[float], base: list[float]) -> float | None:
    """Median over rounds of value / baseline, each ratio taken within one round."""
    pairs = [(v, b) for v, b in zip(values, base, strict=False) if b > 0]
    return median([v / b for v, b in pairs]) if pairs else None


def common_prefix(a: list[int], b: list[int]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / 2**20:.1f}"


def _percent(share: float | None) -> str:
    return "—" if share is None else f"{share:.0%}"


def limit_shares(point: dict, limits: dict | None, length: int) -> tuple[float | None, ...]:
    """(decode, prefill) as shares of the machine's limits: a token's bytes (the GGUF's
    weights and the KV this system reads for the sequence: what it holds, at most the prompt's
    full float16 KV, as a cache reserved for the whole context is read only where it holds
    tokens) over the median decode gap against the memory bandwidth; the prompt's FLOPs over
    the median TTFT against the plain-GEMM peak."""
    if not limits:
        return None, None
    kv_read = min(point["kv_bytes"] or 0, limits["context_kv_bytes"][str(length)])
    step_bytes = limits["weights_bytes"] + kv_read
    decode = share_of_limit(median(point["decode_ms_per_token"]) / 1e3, step_bytes,
                            limits["bandwidth_gb_s"] * 1e9)
    prefill = share_of_limit(median(point["ttft_ms"]) / 1e3, limits["prompt_flops"][str(length)],
                             limits["gemm_gflop_s"] * 1e9)
    return decode, prefill


def _row(name: str, point: dict, base: dict | None, ref: dict | None,
         shares: tuple[float | None, ...]) -> list[object]:
    decode, ttft = point["decode_ms_per_token"], point["ttft_ms"]
    ratio = same_round_ratio(decode, base["decode_ms_per_token"]) if base else None
    ttft_ratio = same_round_ratio(ttft, base["ttft_ms"]) if base else None
    same = (f"{common_prefix(point['token_ids'], ref['token_ids'])}/{len(point['token_ids'])}"
            if ref else "—")
    return [name, f"{median(decode):.1f}", "—" if ratio is None else f"{ratio:.2f}×",
            _percent(shares[0]), f"{median(ttft) / 1e3:.2f}",
            "—" if ttft_ratio is None else f"{ttft_ratio:.2f}×", _percent(shares[1]),
            _mib(point["peak_rss_bytes"]), _mib(point["kv_bytes"]),
            "yes" if point["passkey_found"] else "no", same,
            f"{median(point['other_cores_busy']):.1f}"]


def results_table(results: dict, baseline: str) -> str:
    systems = results["systems"]
    rows = []
    for prompt in results["prompts"]:
        length = prompt["tokens"]
        base = systems.get(baseline, {}).get("points", {}).get(length)
        ref = systems.get(REFERENCE, {}).get("points", {}).get(length)
        for name, summary in systems.items():
            if point := summary["points"].get(length):
                shares = limit_shares(point, results.get("limits"), length)
                rows.append([length, *_row(name, point, base, ref, shares)])
            elif length > results.get("max_lengths", {}).get(name, length):
                rows.append([length, name, "not run: prompts over "
                             f"{results['max_lengths'][name]} tokens are too slow or too big for "
                             "this system on this machine (--max-length)", *["—"] * 10])
    return markdown_table(
        ["prompt tokens", "system", "decode ms/token", f"decode / {baseline}",
         "decode % of bandwidth", "TTFT s", f"TTFT / {baseline}", "prefill % of peak",
         "peak RSS MiB", "KV MiB/seq", "passkey in output",
         f"first tokens = {REFERENCE}", "other jobs' cores"], rows)


def memory_table(results: dict, baseline: str, pool_bytes: int = 4 * 2**30) -> str:
    """At the longest prompt: KV bytes per sequence, how many times smaller than the
    baseline's, and how many such sequences ``pool_bytes`` of KV holds."""
    length = max(p["tokens"] for p in results["prompts"])
    points = {name: s["points"].get(length) for name, s in results["systems"].items()}
    base_kv = (points.get(baseline) or {}).get("kv_bytes")
    rows = []
    for name, point in points.items():
        kv = point and point["kv_bytes"]
        if not kv:
            continue
        rows.append([name, _mib(kv), f"{base_kv / kv:.1f}×" if base_kv else "—",
                     pool_bytes // kv, _mib(point["peak_rss_bytes"])])
    return markdown_table(
        ["system", f"KV MiB per {length}-token sequence", f"{baseline} KV / this",
         f"sequences in {pool_bytes / 2**30:.0f} GiB of KV", "peak RSS MiB (1 sequence)"], rows)


def _versions(summary: dict) -> str:
    pins = [v for v in summary["venv_versions"]
            if v.split("==")[0].lower().replace("_", "-") in
            {p.replace("_", "-") for p in KEY_PACKAGES}]
    build = summary["venv_build_s"]
    built = f"built in {build / 60:.1f} min" if build is not None else "the project's venv"
    return f"{', '.join(pins) or 'n/a'} ({built})"


def _settings(summary: dict) -> str:
    settings = dict(summary.get("load", {}).get("settings", {}))
    if info := summary.get("hello", {}).get("system_info"):
        settings["system_info"] = info
    return "; ".join(f"{key} = {value}" for key, value in settings.items())


def _per_layer_kind(windows: tuple[int | None, ...]) -> str:
    """Where the budget applies on a model with sliding-window layers ('' on one without)."""
    sliding = [w for w in windows if w is not None]
    if not sliding:
        return ""
    return (f" per global layer ({len(windows) - len(sliding)} of {len(windows)}); the "
            f"{len(sliding)} sliding-window layers keep at most their window of {max(sliding)} "
            "tokens")


def _limits_text(limits: dict | None) -> str:
    if not limits:
        return ""
    return (f" This machine's limits, measured before the systems started: memory bandwidth "
            f"{limits['bandwidth_gb_s']:.1f} GB/s (`torch.sum` over 1 GiB, best of 5), plain-GEMM "
            f"peak {limits['gemm_gflop_s']:.0f} GFLOP/s (`torch.mm` at the prompt's shapes, "
            "float32 and bfloat16, the best). Decode % of bandwidth: the GGUF's bytes (every "
            "weight read once a token) and the KV the system reads for the sequence (what it "
            "holds, at most the prompt's full float16 KV: a cache reserved for the whole "
            "context is read only where it holds tokens), over the decode gap; "
            "prefill % of peak: the prompt's FLOPs (every token through every layer, causal "
            "attention) over the TTFT.")


def render(results: dict, cfg: PeersBenchConfig, baseline: str) -> str:
    systems = results["systems"]
    budget, model = cfg.budget, peer_model(cfg.model)
    weights_mib = model.gguf.stat().st_size / 2**20
    lines = [
        f"## Peers on {model.title}: batch-1 decode and time to first token on the same CPU "
        f"and tokens{capped_title()}",
        "", f"Command: `{command_line()}`  ",
        f"Machine: {machine_line()}; {cfg.n_threads} threads per system  ",
        f"Model: {model.title} from `{os.path.basename(results['model'])}` ({model.source}); "
        "every system gets the same prompt token ids (raw text, no chat template: licence texts "
        "from /usr/share/common-licenses with a passkey sentence at half depth, ending with the "
        f"question), greedy, exactly {cfg.max_new_tokens} new tokens (EOS ignored). Decode "
        "ms/token: median gap between consecutive new tokens; TTFT: prompt in → first token "
        f"out (the whole prefill). Medians over {cfg.rounds} rounds; in each round the systems "
        "take turns at each length (the first one rotates) and ratios are taken within a round, "
        "then their median. Budget for the compressing systems: "
        f"{budget.total} tokens (sinks {budget.n_sink}, recent {budget.n_recent}, SnapKV "
        f"observation window {budget.observation})"
        f"{_per_layer_kind(model.attention_windows)}. Peak RSS is the runner "
        "process's high-water mark so far (it includes "
        "shorter prompts run before). Passkey: the output text contains it. Other jobs' "
        "cores: how many cores processes outside the benchmark (and, on a virtual machine, "
        "its host's other guests: steal) kept busy during the measurement (median; the "
        f"machine has {os.cpu_count()}).{_limits_text(results.get('limits'))}", "",
        results_table(results, baseline), "",
        "Memory at the longest prompt (KV as each system holds it for one sequence; the "
        "sequences that fit count KV alone, the weights come on top: the GGUF's "
        f"{weights_mib:.0f} MiB for llama.cpp, several times that for the fp32 systems):", "",
        memory_table(results, baseline), "",
        "Systems:", "",
    ]
    for name, summary in systems.items():
        kv = next(iter(summary["points"].values()), {}).get("kv_note", "")
        failed = f" **Failed:** {summary['failure']}" if summary["failure"] else ""
        lines.append(f"- **{name}**: {summary['label']}. Settings: {_settings(summary)}. KV: "
                     f"{kv}. Versions: {_versions(summary)}.{failed}")
    for name, why in results["failures"].items():
        lines.append(f"- **{name}**: not measured: {why}")
    return "\n".join(lines)
