"""The draft's ranking of one prompt with its prompt forward in float32 and in bfloat16 (the
quantized formats' prompt dtype on CPUs with bfloat16 instructions; the row names the draft
engine's own), interleaved in one process: the median seconds of each and the share of the
chunks kept at 25% that both keep.

``python -m bench.specprefill_draft_dtype --draft smollm2-135m --length 4096 --rounds 3``
prints one table row (docs/speculative.md has the figures).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from snapstream.weight_formats import AUTO, DTYPE_CHOICES


def measure(draft_name: str, length: int, rounds: int, dtype: str = AUTO) -> str:
    import torch

    from evaldata import PromptSpec, TaskConfig, generate
    from snapstream.engine import Engine
    from snapstream.specprefill.chunks import chunk_bounds, rank_chunks
    from snapstream.specprefill.scoring import score_prompt

    draft = Engine.from_pretrained(draft_name, dtype=dtype)
    text = generate("passkey", random.Random(f"speculative-ttft/{length}"),
                    TaskConfig(context_len=length), PromptSpec(draft.tokenizer, "raw")).prompt
    ids, stop = draft.tokenizer.encode(text), set(draft.tokenizer.eos_token_ids)
    score_prompt(draft.model, ids[:512], 8, 13, stop, torch.bfloat16)  # untimed warm-up
    times: dict[torch.dtype, list[float]] = {torch.float32: [], torch.bfloat16: []}
    kept = {}
    num_kept = len(ids) // 32 // 4  # chunks of 32, keep 25%
    bounds = chunk_bounds(len(ids), 32)
    for _ in range(rounds):
        for activations, seconds in times.items():
            start = time.perf_counter()
            scores = score_prompt(draft.model, ids, 8, 13, stop, activations).scores  # (P,)
            seconds.append(time.perf_counter() - start)
            ranked = rank_chunks(scores, bounds, (0, len(bounds) - 1))
            kept[activations] = set(ranked[:num_kept].tolist())
    fp32, fast = (statistics.median(v) for v in times.values())
    shared = len(kept[torch.float32] & kept[torch.bfloat16]) / num_kept
    return (f"| {draft_name} | {str(draft.prefill_dtype).removeprefix('torch.')} | {len(ids)} | "
            f"{fp32:.3f} | {fast:.3f} | {fp32 / fast:.2f}× | {shared:.0%} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.specprefill_draft_dtype")
    parser.add_argument("--draft", default="smollm2-135m", help="model name or path")
    parser.add_argument("--length", type=int, default=4096, help="prompt tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO,
                        help="the draft's weight format (auto: the checkpoint's own)")
    args = parser.parse_args(argv)
    print("| draft | prefill dtype | prompt tokens | float32 s | bfloat16 s | speed-up | "
          "chunks kept at 25% by both |")
    print("|---|---|---|---|---|---|---|")
    print(measure(args.draft, args.length, args.rounds, args.dtype))


if __name__ == "__main__":
    main()
