"""snapstream's own engine as a peer runner (run with the project's python, in process: no
router, no store; the prefill -> SequenceCache -> static decode path the services run).

``load`` options: ``dtype`` (``float32``, default). ``generate`` options: ``policy`` = the
fields of a ``CachePolicy`` (kind, n_sink, n_topk, n_recent, window...) laid over the model's
default policy. KV bytes are the decode pool's row for this sequence: K and V of every layer
and KV head over the layout's slots, plus the int32 slot positions.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from importlib.metadata import version

from peer_protocol import generation_reply, serve


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
        dtype = args.get("options", {}).get("dtype", "float32")
        start = time.perf_counter()
        self.engine = Engine.from_pretrained(args["model"], dtype=dtype)
        return {"load_s": time.perf_counter() - start,
                "settings": {"dtype": dtype, "torch_threads": torch.get_num_threads(),
                             "default_policy": str(self.engine.default_policy)}}

    def generate(self, args: dict) -> dict:
        from snapstream.sampling import SamplingParams

        if self.engine is None:
            raise RuntimeError("generate before load")
        engine = self.engine
        policy = replace(engine.default_policy, **args.get("options", {}).get("policy", {}))
        prompt_ids, max_new = args["prompt_ids"], args["max_new_tokens"]
        sampling = SamplingParams(temperature=0.0, ignore_eos=True)
        token_ids, stamps = [], []
        start = time.perf_counter()
        for token in engine.stream(prompt_ids, max_new, policy, sampling):
            stamps.append(time.perf_counter())
            token_ids.append(token)
        layout = policy.layout(len(prompt_ids), max_new)
        config = engine.config
        per_slot = config.num_layers * config.num_kv_heads * (
            2 * config.head_dim * engine.kv_dtype.itemsize + 4)  # K, V and an int32 position
        return generation_reply(
            start=start, stamps=stamps, token_ids=token_ids, kv_bytes=layout.budget * per_slot,
            kv_note=f"the decode row: {layout.budget} slots × layers × KV heads × (K and V in "
                    f"{str(engine.kv_dtype).removeprefix('torch.')} + an int32 position)",
            extra={"policy": str(policy), "slots": layout.budget})


if __name__ == "__main__":
    runner = SnapstreamRunner()
    serve({"hello": runner.hello, "load": runner.load, "generate": runner.generate})
