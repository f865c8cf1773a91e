"""OpenVINO GenAI runner: ``ContinuousBatchingPipeline`` on CPU (run with the openvino venv).

``load`` options: ``cache_eviction`` = ``{"start_size", "recent_size", "max_cache_size",
"aggregation_mode": "SUM" | "NORM_SUM" | "ADAPTIVE_RKV", "snapkv_window_size"}`` turns on
``SchedulerConfig.use_cache_eviction``; absent, the cache holds every token. The prompt is
prefilled in one step (``max_num_batched_tokens = n_ctx``, as OpenVINO's own LLMPipeline does
for one client) and the KV cache is allocated on demand. Compute runs at the CPU plugin's
default inference precision (bf16 on a CPU with AVX512_BF16 or AMX, reported by ``load``).
``generate`` adds one request with the prompt ids as an ``ov.Tensor`` and drives ``step()``
itself, stamping each token as it comes out; the KV bytes are the pipeline's reported cache
usage × allocated cache bytes at the last step.
"""

from __future__ import annotations

import os
import time
from importlib.metadata import version

from peer_protocol import generation_reply, serve


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

    def generate(self, args: dict) -> dict:
        import numpy as np
        import openvino as ov
        import openvino_genai as ov_genai

        if self.pipe is None:
            raise RuntimeError("generate before load")
        config = ov_genai.GenerationConfig(max_new_tokens=args["max_new_tokens"],
                                           ignore_eos=True, do_sample=False)
        ids = ov.Tensor(np.array([args["prompt_ids"]], dtype=np.int64))  # (1, T)
        self.next_request_id += 1
        start = time.perf_counter()
        handle = self.pipe.add_request(self.next_request_id, ids, config)
        token_ids, stamps, kv_bytes = [], [], None
        while self.pipe.has_non_finished_requests():
            self.pipe.step()
            now = time.perf_counter()
            metrics = self.pipe.get_metrics()
            if metrics.cache_usage > 0:
                kv_bytes = round(metrics.cache_usage / 100 * metrics.cache_size_in_bytes)
            if handle.can_read():
                for output in handle.read().values():
                    token_ids += list(output.generated_ids)
                    stamps += [now] * len(output.generated_ids)
        return generation_reply(
            start=start, stamps=stamps, token_ids=token_ids, kv_bytes=kv_bytes,
            kv_note="PipelineMetrics.cache_usage × cache_size_in_bytes at the last step "
                    "(whole KV blocks)")


if __name__ == "__main__":
    runner = OpenVINORunner()
    serve({"hello": runner.hello, "load": runner.load, "generate": runner.generate})
