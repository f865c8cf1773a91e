"""OpenVINO GenAI runner: ``ContinuousBatchingPipeline`` on CPU (run with the openvino venv).

``load`` options: ``cache_eviction`` = ``{"start_size", "recent_size", "max_cache_size",
"aggregation_mode": "SUM" | "NORM_SUM" | "ADAPTIVE_RKV", "snapkv_window_size"}`` turns on
``SchedulerConfig.use_cache_eviction``; absent, the cache holds every token. The prompt is
prefilled in one step (``max_num_batched_tokens = n_ctx``, as OpenVINO's own LLMPipeline does
for one client) and the KV cache is allocated on demand. Compute runs at the CPU plugin's
default inference precision (bf16 on a CPU with AVX512_BF16 or AMX, reported by ``load``).
``generate`` adds one request with the prompt ids as an ``ov.Tensor`` and drives ``step()``
itself, stamping each token as it comes out; the KV bytes are the pipeline's reported cache
usage × allocated cache bytes, the most of any step. ``generate_batch`` adds every prompt as a
request at once and lets the pipeline's scheduler batch them (prompts and decode steps mixed
as it sees fit); its KV bytes are that most divided by the requests.
"""

from __future__ import annotations

import os
import time
from importlib.metadata import version

from peer_protocol import batch_reply, generation_reply, serve

KV_NOTE = ("PipelineMetrics.cache_usage × cache_size_in_bytes, the most of any step (whole KV "
           "blocks)")


class OpenVINORunner:
    def __init__(self) -> None:
        self.pipe = None
        self.next_request_id = 0

    def hello(self, args: dict) -> dict:
        versions = {name: version(name) for name in ("openvino", "openvino-genai",
                                                     "openvino-tokenizers", "optimum-intel")}
        return {"system": "openvino-genai", "pid": os.getpid(), "versions": versions}

    def load(self, args: dict) -> dict:
        import openvino as ov
        import openvino_genai as ov_genai

        scheduler = ov_genai.SchedulerConfig()
        scheduler.max_num_batched_tokens = args["n_ctx"]
        scheduler.cache_size = 0  # with num_kv_blocks = 0: blocks allocated as needed
        eviction = args.get("options", {}).get("cache_eviction")
        if eviction:
            scheduler.use_cache_eviction = True
            scheduler.cache_eviction_config = ov_genai.CacheEvictionConfig(
                start_size=eviction["start_size"], recent_size=eviction["recent_size"],
                max_cache_size=eviction["max_cache_size"],
                aggregation_mode=getattr(ov_genai.AggregationMode,
                                         eviction["aggregation_mode"]),
                snapkv_window_size=eviction["snapkv_window_size"])
        start = time.perf_counter()
        self.pipe = ov_genai.ContinuousBatchingPipeline(
            args["model"], scheduler, "CPU", {"INFERENCE_NUM_THREADS": args["n_threads"]})
        precision = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
        return {"load_s": time.perf_counter() - start,
                "settings": {"inference_precision": str(precision),
                             "max_num_batched_tokens": scheduler.max_num_batched_tokens,
                             "cache_eviction": eviction or "off"}}

    def _run(self, prompts: list[list[int]], max_new_tokens: int
             ) -> tuple[float, list[list[float]], list[list[int]], int | None]:
        """Every prompt as a request at once, stepped to the end -> (start, stamps, token ids,
        the most KV bytes in use at any step)."""
        import numpy as np
        import openvino as ov
        import openvino_genai as ov_genai

        if self.pipe is None:
            raise RuntimeError("generate before load")
        config = ov_genai.GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=True,
                                           do_sample=False)
        start = time.perf_counter()
        handles = []
        for ids in prompts:
            self.next_request_id += 1
            tensor = ov.Tensor(np.array([ids], dtype=np.int64))  # (1, T)
            handles.append(self.pipe.add_request(self.next_request_id, tensor, config))
        stamps: list[list[float]] = [[] for _ in prompts]
        token_ids: list[list[int]] = [[] for _ in prompts]
        kv_bytes = None
        while self.pipe.has_non_finished_requests():
            self.pipe.step()
            now = time.perf_counter()
            metrics = self.pipe.get_metrics()
            used = round(metrics.cache_usage / 100 * metrics.cache_size_in_bytes)
            kv_bytes = max(kv_bytes or 0, used) or None
            for row, handle in enumerate(handles):
                if handle.can_read():
                    for output in handle.read().values():
                        token_ids[row] += list(output.generated_ids)
                        stamps[row] += [now] * len(output.generated_ids)
        return start, stamps, token_ids, kv_bytes

    def generate(self, args: dict) -> dict:
        start, stamps, token_ids, kv_bytes = self._run([args["prompt_ids"]],
                                                       args["max_new_tokens"])
        return generation_reply(start=start, stamps=stamps[0], token_ids=token_ids[0],
                                kv_bytes=kv_bytes, kv_note=KV_NOTE)

    def generate_batch(self, args: dict) -> dict:
        prompts = args["prompts"]
        start, stamps, token_ids, kv_bytes = self._run(prompts, args["max_new_tokens"])
        per_sequence = None if kv_bytes is None else kv_bytes // len(prompts)
        return batch_reply(start=start, stamps=stamps, token_ids=token_ids,
                           kv_bytes=per_sequence, kv_note=f"{KV_NOTE}, divided by the requests")


if __name__ == "__main__":
    runner = OpenVINORunner()
    serve({"hello": runner.hello, "load": runner.load, "generate": runner.generate,
           "generate_batch": runner.generate_batch})
