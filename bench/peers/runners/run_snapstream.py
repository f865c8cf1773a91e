"""snapstream's own engine as a peer runner (run with the project's python, in process: no
router, no store; the prefill -> SequenceCache -> static decode path the services run).

``load`` options: ``dtype`` (a name of ``weight_formats.DTYPE_CHOICES``; default ``auto``, the
format the service runs), ``kv_dtype`` (a name of ``weight_formats.KV_DTYPES``; default the
format's own). ``generate`` options: ``policy`` = the
fields of a ``CachePolicy`` (kind, n_sink, n_topk, n_recent, observation...) laid over the model's
default policy. KV bytes are the decode pool's row for this sequence
(``snapstream.kvcache.pool_row_bytes``: K and V of every layer and KV head over the layout's
slots in the served KV dtype, and the row's slot mask).

``generate_batch`` prefills the prompts one by one, a prompt that repeats once (each first
token stamped as its prefill ends), puts them into one decode pool of as many rows, and runs
the static decode step over all of them until each has its tokens: what a decode worker does
once its rows are full.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from importlib.metadata import version

from peer_protocol import batch_reply, generation_reply, serve


class SnapstreamRunner:
    def __init__(self) -> None:
        self.engine = None

    def hello(self, args: dict) -> dict:
        versions = {name: version(name) for name in ("snapstream", "torch")}
        return {"system": "snapstream", "pid": os.getpid(), "versions": versions}

    def load(self, args: dict) -> dict:
        import torch

        from snapstream.engine import Engine

        torch.set_num_threads(args["n_threads"])
        options = args.get("options", {})
        dtype = options.get("dtype", "auto")
        start = time.perf_counter()
        self.engine = Engine.from_pretrained(args["model"], dtype=dtype,
                                             kv_dtype=options.get("kv_dtype"))
        warm_up_s = self.engine.warm_up_prefill()  # what a prefill worker runs at start-up
        quantized = {type(m).__name__ for m in self.engine.model.modules()} & {
            "Int4Linear", "Int8Linear"}
        return {"load_s": time.perf_counter() - start, "warm_up_s": warm_up_s,
                "settings": {"dtype": dtype, "weights": sorted(quantized) or ["float"],
                             "activations": str(self.engine.dtype).removeprefix("torch."),
                             "kv_cache": str(self.engine.kv_dtype).removeprefix("torch."),
                             "torch_threads": torch.get_num_threads(),
                             "default_policy": str(self.engine.default_policy)}}

    def _policy(self, args: dict):
        if self.engine is None:
            raise RuntimeError("generate before load")
        return replace(self.engine.default_policy, **args.get("options", {}).get("policy", {}))

    def _kv(self, layout) -> tuple[int, str]:
        from snapstream.kvcache import pool_row_bytes
        from snapstream.kvquant import Int8KV

        kv_dtype = self.engine.kv_dtype
        return pool_row_bytes(self.engine.config, layout, kv_dtype), (
            f"the decode pool's row: {layout.num_slots} slots over the layers × KV heads × K "
            f"and V in {str(kv_dtype).removeprefix('torch.')}"
            f"{' (codes + a float32 scale per row)' if kv_dtype == Int8KV.dtype else ''}, and "
            "a slot mask")

    def generate(self, args: dict) -> dict:
        from snapstream.sampling_params import SamplingParams

        policy, engine = self._policy(args), self.engine
        prompt_ids, max_new = args["prompt_ids"], args["max_new_tokens"]
        sampling = SamplingParams(temperature=0.0, ignore_eos=True)
        token_ids, stamps = [], []
        start = time.perf_counter()
        for token in engine.stream(prompt_ids, max_new, policy, sampling):
            stamps.append(time.perf_counter())
            token_ids.append(token)
        layout = engine.model_layout(policy.layout(len(prompt_ids), max_new))
        kv_bytes, kv_note = self._kv(layout)
        return generation_reply(
            start=start, stamps=stamps, token_ids=token_ids, kv_bytes=kv_bytes,
            kv_note=kv_note, extra={"policy": str(policy), "slots": layout.global_slots})

    def generate_batch(self, args: dict) -> dict:
        import torch

        policy, engine = self._policy(args), self.engine
        prompts, max_new = args["prompts"], args["max_new_tokens"]
        capacity = max(map(len, prompts)) + max_new  # one layout for every row
        start = time.perf_counter()
        results, token_ids, stamps = [], [], []
        prefilled = {}  # prompt ids -> its prefill: a repeated prompt is prefilled once
        for ids in prompts:
            key = tuple(ids)
            if key not in prefilled:
                prefilled[key] = engine.prefill(ids, policy, max_new, capacity=capacity)
            results.append(prefilled[key])
            token_ids.append([int(results[-1].logits.argmax())])
            stamps.append([time.perf_counter()])
        layout = results[0].cache.layout
        decoder = engine.new_decoder(layout, len(prompts))
        for row, result in enumerate(results):
            decoder.cache.insert(row, result.cache)
        positions = torch.tensor([len(ids) for ids in prompts])  # (B,)
        for _ in range(max_new - 1):
            tokens = torch.tensor([row[-1] for row in token_ids])  # (B,)
            greedy = decoder.step(tokens, positions).argmax(dim=-1).tolist()
            now = time.perf_counter()
            for row, token in enumerate(greedy):
                token_ids[row].append(token)
                stamps[row].append(now)
            positions += 1
        kv_bytes, kv_note = self._kv(layout)
        return batch_reply(start=start, stamps=stamps, token_ids=token_ids, kv_bytes=kv_bytes,
                           kv_note=kv_note, extra={"policy": str(policy),
                                                   "slots": layout.global_slots,
                                                   "prefills": len(prefilled)})


if __name__ == "__main__":
    runner = SnapstreamRunner()
    serve({"hello": runner.hello, "load": runner.load, "generate": runner.generate,
           "generate_batch": runner.generate_batch})
