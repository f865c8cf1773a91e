"""`bench serve` results as markdown (tables with the serving targets marked) and a figure."""

from __future__ import annotations

from pathlib import Path

from bench.report import command_line, fmt_ms, machine_line, markdown_table

TTFT_OVERHEAD_S = 0.015  # router - in-process, p50
ITL_OVERHEAD_S = 0.002
THROUGHPUT_RATIO = 0.8  # router / in-process at THROUGHPUT_CONCURRENCY
THROUGHPUT_CONCURRENCY = 32
BLOB_MB_S = 500.0  # put and get, for BLOB_TARGET_SIZE
BLOB_TARGET_SIZE = 64 * 2**20
SYSTEMS = ("in-process", "router")
COLORS = {"in-process": "tab:blue", "router": "tab:orange", "openai": "tab:green"}
PROCESSES = ("bench", "router", "prefill", "decode-0", "store")
PROCESS_LABELS = ("bench", "router", "prefill", "decode", "store")
# the processes whose CPU time is a system's cost: in-process runs everything in the bench's
SYSTEM_PROCESSES = {"in-process": ("bench",), "router": PROCESSES}


def render(results: dict, section: str) -> str:
    """The router against the in-process engine, once per KV store (and the blob transfer);
    other systems, or these in another order, are compared by ``serve_compare``."""
    lines = ["## Serving: router vs in-process engine; KV blob transfer", "",
             f"Command: `{command_line()}`  ", f"Machine: {machine_line()}"]
    serves = results.get("serve", [])
    if serves:
        lines += ["", *_workload_text(serves[0]), "", QUEUEING_NOTE]
    for serve in serves:
        lines += ["", f"### {serve['config']['store']} store", "",
                  latency_table(serve["levels"], SYSTEMS), "", _target_table(serve["levels"]),
                  "", _profile_table(serve["levels"]), "",
                  f"![latency and throughput vs concurrency](img/{image_name(section, serve)})"]
    if "blob" in results:
        lines += ["", *_blob_text(results["blob"])]
    return "\n".join(lines)


def image_name(section: str, serve: dict) -> str:
    return f"{section}-{serve['config']['store']}_latency.png"


def _mark(is_met: bool) -> str:
    return "met" if is_met else "**missed**"


def _workload_text(serve: dict) -> list[str]:
    cfg, model = serve["config"], serve["model"]
    policy, slo = cfg["policy"], cfg["slo"]
    return [
        f"Model: `{model['path']}`, weights {model['weight_bytes'] / 2**20:.0f} MiB as held, "
        f"{model['num_layers']} layers, hidden {model['hidden_size']}, {model['num_kv_heads']} KV "
        f"heads × {model['head_dim']}, prompt activations {model['prefill_dtype']}, decode "
        f"activations {model['dtype']}, KV cache {model['kv_dtype']}, context "
        f"{model['context_len']}, "
        f"{model['torch_threads']} torch threads per process.  ",
        f"Workload: passkey prompts of {model['prompt_tokens'][0]}–{model['prompt_tokens'][1]} "
        f"tokens, greedy, up to {cfg['max_new_tokens']} new tokens (a stream also ends at EOS: "
        f"throughput counts tokens), the model's default policy {policy['kind']} "
        f"(n_sink={policy['n_sink']}, n_topk={policy['n_topk']}, n_recent={policy['n_recent']}, "
        f"observation={policy['observation']}, kernel={policy['kernel']}), "
        f"blob {model['blob_bytes'] / 2**20:.2f} MiB. Closed loop: at concurrency c, c clients "
        "each send their next request when the previous one ends; every system gets the same "
        f"prompts in each of {cfg['rounds']} rounds (the systems take turns, alternating which "
        f"goes first), after {cfg['warmup']} warm-up requests.  ",
        f"router: a local cluster (the store named in each subsection, 1 prefill worker, 1 "
        f"decode worker with {cfg['rows']} rows, router; each a process) through the asyncio "
        "client SDK; TTFT = request sent → first token chunk received, ITL = gaps between token "
        "arrivals (a chunk carries every token produced since the last one; tokens/chunk shows "
        "how often a stream fell behind). "
        "in-process: the same prefill (one thread) and `DecodeLoop` with the same rows in one "
        "process, no gRPC and no store, measured in the same run as each store's router; TTFT = "
        "call → first token back on the caller's event loop, ITL from the step loop's stamps. "
        f"Goodput: requests/s with TTFT ≤ {slo['ttft_s'] * 1e3:.0f} ms and their own p90 ITL ≤ "
        f"{slo['itl_p90_s'] * 1e3:.0f} ms.",
    ]


QUEUEING_NOTE = (
    "How to read the overheads: on this 2-core machine the router's extra processes (router, "
    "store, two workers) compete with the model for the same cores, so from c = 8 on the "
    "latency overhead measures queueing (requests waiting behind each other's prefills and "
    "steps), not the cost of the path. The cost of the path is the router's CPU overhead: the "
    "CPU time of the client, router, store, prefill and decode processes (from /proc) minus "
    "the in-process system's (its one process: client and engine), per generated token.")


def latency_table(levels: list[dict], systems: tuple[str, ...]) -> str:
    rows = []
    for level in levels:
        for system in systems:
            s = level[system]
            rows.append([level["concurrency"], system, s["requests"], s["tokens"],
                         *(fmt_ms(s[f"ttft_p{p}_s"]) for p in (50, 90, 99)),
                         *(fmt_ms(s[f"itl_p{p}_s"]) for p in (50, 90, 99)),
                         f"{s['tokens_per_chunk']:.2f}", f"{s['throughput_tok_s']:.1f}",
                         f"{s['goodput_req_s']:.2f} ({s['slo_met']:.0%})"])
    return markdown_table(
        ["c", "system", "requests", "tokens", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms",
         "ITL p50 ms", "ITL p90 ms", "ITL p99 ms", "tokens/chunk", "tokens/s",
         "goodput req/s (SLO met)"], rows)


def cpu_ms_per_token(stats: dict, system: str) -> float:
    """CPU milliseconds per generated token of the processes that make up ``system``."""
    cpu = stats["profile"]["cpu_s"]
    return sum(cpu[name] for name in SYSTEM_PROCESSES[system]) / stats["tokens"] * 1e3


def _overheads(figures: dict[str, dict]) -> tuple[float, float, float]:
    """(TTFT p50 overhead s, ITL p50 overhead s, throughput ratio) of router over in-process."""
    ours, base = figures["router"], figures["in-process"]
    return (ours["ttft_p50_s"] - base["ttft_p50_s"], ours["itl_p50_s"] - base["itl_p50_s"],
            ours["throughput_tok_s"] / base["throughput_tok_s"])


def _target_table(levels: list[dict]) -> str:
    rows = []
    for level in levels:
        ttft, itl, ratio = _overheads(level)
        per_round = list(zip(*(_overheads(figures) for figures in level["rounds"]), strict=True))
        is_rated = level["concurrency"] == THROUGHPUT_CONCURRENCY
        cpu = {system: cpu_ms_per_token(level[system], system) for system in SYSTEMS}
        rows.append([level["concurrency"],
                     f"{cpu['router'] - cpu['in-process']:+.2f} ({cpu['router']:.2f} − "
                     f"{cpu['in-process']:.2f})",
                     f"{ttft * 1e3:+.2f} ({', '.join(f'{x * 1e3:+.0f}' for x in per_round[0])})",
                     _mark(ttft <= TTFT_OVERHEAD_S),
                     f"{itl * 1e3:+.2f} ({', '.join(f'{x * 1e3:+.1f}' for x in per_round[1])})",
                     _mark(itl <= ITL_OVERHEAD_S),
                     f"{ratio:.2f}× ({', '.join(f'{x:.2f}' for x in per_round[2])})",
                     _mark(ratio >= THROUGHPUT_RATIO) if is_rated else "—",
                     f"{level['identical_outputs']}/{level['router']['requests']}"])
    return ("Against the targets, over all rounds; in parentheses each round alone (a round "
            "runs both systems back to back), which shows how far the figures move between "
            "runs on this shared machine:\n\n" + markdown_table(
                ["c", "router CPU overhead ms/token (router − in-process)",
                 "TTFT p50 overhead ms", f"≤ {TTFT_OVERHEAD_S * 1e3:.0f} ms",
                 "ITL p50 overhead ms", f"≤ {ITL_OVERHEAD_S * 1e3:.0f} ms",
                 "throughput router / in-process",
                 f"≥ {THROUGHPUT_RATIO:.0%} at c={THROUGHPUT_CONCURRENCY}", "identical outputs"],
                rows))


def _profile_table(levels: list[dict]) -> str:
    rows = []
    for level in levels:
        for system, where in zip(SYSTEMS, ("in_process", "worker"), strict=True):
            stats = level[system]
            means, cpu = stats["profile"]["mean_s"], stats["profile"]["cpu_s"]
            per_token = [cpu.get(name, 0.0) / stats["tokens"] * 1e3 for name in PROCESSES]
            rows.append([level["concurrency"], system, fmt_ms(means[f"{where}_prefill_queue"]),
                         fmt_ms(means[f"{where}_prefill"]), fmt_ms(means[f"{where}_step"]),
                         fmt_ms(means["blob_put"] if system == "router" else None),
                         fmt_ms(means["blob_get"] if system == "router" else None),
                         *(f"{ms:.2f}" for ms in per_token), f"{sum(per_token):.2f}",
                         f"{(sum(cpu.values()) - cpu['other']) / stats['wall_s']:.2f}",
                         f"{cpu['other'] / stats['wall_s']:.2f}"])
    return ("Where the time goes: means over each run from the services' Prometheus histograms, "
            "and CPU time per generated token of each process from /proc (bench: this "
            "process, i.e. the client, and for in-process the whole system; decode = the decode "
            "worker; cores busy = CPU time of all these / wall time; other = cores that the "
            "machine's other processes kept busy meanwhile, which should be ~0):\n\n"
            + markdown_table(
                ["c", "system", "prefill queue ms", "prefill model ms", "decode step ms",
                 "blob put ms", "blob get ms",
                 *(f"CPU ms/token {name}" for name in PROCESS_LABELS), "CPU ms/token all",
                 "cores busy", "other"], rows))


def _blob_text(points: list[dict]) -> list[str]:
    rows = []
    for p in points:
        put_mb_s, get_mb_s = p["size"] / p["put_s"] / 1e6, p["size"] / p["get_s"] / 1e6
        target = (_mark(min(put_mb_s, get_mb_s) >= BLOB_MB_S)
                  if p["size"] == BLOB_TARGET_SIZE else "—")
        rows.append([p["store"], f"{p['size'] / 2**20:g} MiB", fmt_ms(p["put_s"]),
                     fmt_ms(p["get_s"]), f"{put_mb_s:.0f}", f"{get_mb_s:.0f}",
                     fmt_ms(p["mac_s"]), target,
                     "—" if p["other_cores"] is None else f"{p['other_cores']:.2f}"])
    return ["KV blob transfer on loopback: one client, `put` then `get` of a random blob "
            "through `kvstore.open_store` with default options, to a store server started "
            "as the local cluster starts it; medians of the repeats, MB = 10^6 bytes; MAC = one "
            "HMAC-SHA256 of the blob (its seal: the prefill worker makes it, the decode worker "
            "checks it); other = cores that other processes kept busy meanwhile (— : too short "
            "to tell).", "",
            markdown_table(["store", "blob", "put ms", "get ms", "put MB/s", "get MB/s",
                            "MAC ms", f"≥ {BLOB_MB_S:.0f} MB/s both ways (64 MiB)", "other"],
                           rows)]


def plot(serve: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = serve["levels"]
    xs = [level["concurrency"] for level in levels]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for system in serve["config"]["systems"]:
        color = COLORS[system]
        for metric, ax in (("ttft", axes[0]), ("itl", axes[1])):
            for p, style in zip((50, 90, 99), ("-", "--", ":"), strict=True):
                ax.plot(xs, [level[system][f"{metric}_p{p}_s"] * 1e3 for level in levels],
                        style, color=color, marker="o", label=f"{system} p{p}")
        axes[2].plot(xs, [level[system]["throughput_tok_s"] for level in levels], color=color,
                     marker="o", label=system)
    for ax, title, unit in ((axes[0], "time to first token", "ms"),
                            (axes[1], "inter-token latency", "ms"),
                            (axes[2], "throughput", "generated tokens / s")):
        ax.set(xscale="log", xlabel="concurrency", ylabel=unit, title=title, xticks=xs,
               xticklabels=[str(x) for x in xs])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
