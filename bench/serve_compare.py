"""`bench serve` with other systems than the default pair (e.g. ``--systems router,openai``):
each system against the first one listed, measured in the same run, as markdown."""

from __future__ import annotations

from bench.report import command_line, machine_line, markdown_table
from bench.serve_report import PROCESS_LABELS, PROCESSES, image_name, latency_table

DESCRIPTIONS = {
    "in-process": "the engine and a `DecodeLoop` in the benchmark's process, no gRPC, no store",
    "router": "the local cluster's router over gRPC, through the asyncio client SDK "
              "(TTFT = request sent → first token chunk)",
    "openai": "an OpenAI-compatible server through the official `openai` client's async "
              "streaming `/v1/completions`, the prompt as token ids (TTFT = request sent → "
              "first event with a token)",
}


def section_name(systems: tuple[str, ...]) -> str:
    return "serve-" + "-".join(systems)


def render(serves: list[dict], section: str) -> str:
    """One subsection per KV store, the systems measured against the first one listed."""
    cfg, model = serves[0]["config"], serves[0]["model"]
    systems = tuple(cfg["systems"])
    target = cfg["openai_url"] or "the local cluster's router (the same process as gRPC's)"
    lines = [f"## Serving: {', '.join(systems[1:])} against {systems[0]}", "",
             f"Command: `{command_line()}`  ", f"Machine: {machine_line()}", "",
             f"Model: `{model['path']}`, context {model['context_len']}, "
             f"{model['torch_threads']} torch threads per process. Workload: passkey prompts of "
             f"{model['prompt_tokens'][0]}–{model['prompt_tokens'][1]} tokens, greedy, up to "
             f"{cfg['max_new_tokens']} new tokens, policy {cfg['policy']['kind']}; closed loop "
             f"at each concurrency, {cfg['rounds']} rounds with the systems taking turns "
             f"(alternating which goes first), after {cfg['warmup']} warm-up requests each. "
             f"Local cluster: the store named in each subsection, 1 prefill worker, 1 decode "
             f"worker with {cfg['rows']} rows, router; each a process.", ""]
    lines += [f"- {name}: {DESCRIPTIONS[name]}" + (f"; server: {target}" if name == "openai"
                                                    else "") for name in systems]
    lines += ["", "ITL = gaps between token arrivals (the tokens of one chunk or event arrive "
              "together)."]
    for serve in serves:
        levels = serve["levels"]
        lines += ["", f"### {serve['config']['store']} store", "",
                  latency_table(levels, systems), "", _overhead_table(levels, systems), "",
                  _cpu_table(levels, systems), "",
                  f"![latency and throughput vs concurrency](img/{image_name(section, serve)})"]
    return "\n".join(lines)


def _difference(figures: dict, system: str, base: str, key: str) -> float:
    return figures[system][key] - figures[base][key]


def _overhead_table(levels: list[dict], systems: tuple[str, ...]) -> str:
    base, rows = systems[0], []
    for level in levels:
        for system in systems[1:]:
            cells = [level["concurrency"], system]
            for key in ("ttft_p50_s", "itl_p50_s"):
                rounds = ", ".join(f"{_difference(r, system, base, key) * 1e3:+.2f}"
                                   for r in level["rounds"])
                cells += [f"{_difference(level, system, base, key) * 1e3:+.2f} ({rounds})",
                          f"{level[system][key] / level[base][key]:.2f}×"]
            cells += [f"{level[system]['throughput_tok_s'] / level[base]['throughput_tok_s']:.2f}×",
                      f"{level['identical_outputs']}/{level[system]['requests']}"]
            rows.append(cells)
    return (f"Against {base}, over all rounds; in parentheses each round alone (a round runs "
            "every system back to back):\n\n" + markdown_table(
                ["c", "system", "TTFT p50 − base ms", "TTFT p50 / base", "ITL p50 − base ms",
                 "ITL p50 / base", "throughput / base", "identical outputs"], rows))


def _cpu_table(levels: list[dict], systems: tuple[str, ...]) -> str:
    rows = []
    for level in levels:
        for system in systems:
            stats = level[system]
            cpu = stats["profile"]["cpu_s"]
            per_token = [cpu.get(name, 0.0) / stats["tokens"] * 1e3 for name in PROCESSES]
            rows.append([level["concurrency"], system, *(f"{ms:.2f}" for ms in per_token)])
    return ("CPU time per generated token of each process, from /proc (bench: this process, "
            "the load generator; with an outside server, its CPU is not counted here):\n\n"
            + markdown_table(["c", "system", *(f"CPU ms/token {name}" for name in
                                                PROCESS_LABELS)], rows))
