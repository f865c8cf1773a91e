"""transformers runner, with an optional kvpress press (run with the kvpress venv's python).

The transformers baseline shares the kvpress venv: the same transformers build, model and
greedy loop then run with and without a press, so the press is the only difference between
the two systems (and one torch venv fewer to build and keep).

The model is the GGUF as transformers reads it (dequantized to float32), loaded from the Hugging
Face directory ``bench.peers.models.hf_model_dir`` saved once, with PyTorch's SDPA attention
(eager attention's score matrices would not fit at 32k tokens). Greedy decoding is a plain
loop over ``model(...)`` with explicit positions, as kvpress's own pipeline does: a compressed
cache is shorter than the text it covers, so positions cannot come from the cache length.
``generate`` options: ``press`` = ``{"name": "SnapKVPress", "kwargs": {...}}`` or absent for
the full cache; any press class kvpress exports can be named.

Without a press the cache is built from the model's config, as transformers' own ``generate``
does: on a model with sliding-window layers (Gemma 3) those keep only their window; the prompt
is prefilled in chunks of at most ``PREFILL_TOKENS`` tokens over all rows, as ``generate`` does
with ``prefill_chunk_size``, which bounds the attention masks (a sliding-window layer's is
prompt × prompt: 1 GiB at 32k tokens in one step). With a press the prompt goes in one step
(the press compresses the cache at the end of that forward) onto a plain ``DynamicCache`` on
every layer: on the sliding-window cache kvpress 0.5.5's SnapKVPress (transformers 5.2)
compresses the sliding layers too and the first decode step dies ("RuntimeError: The size of
tensor a (437) must match the size of tensor b (512) at non-singleton dimension 3", Gemma 3 270M,
a 1,200-token prompt); on a plain cache it compresses every layer to the budget and
runs.

``generate_batch`` (no press) runs its prompts, all of one length, as one batch: rows
prefilled together chunk by chunk, then one decode step for every row at a time.
"""

from __future__ import annotations

import contextlib
import os
import time
from importlib.metadata import PackageNotFoundError, version

from peer_protocol import batch_reply, generation_reply, serve

PREFILL_TOKENS = 4096  # prompt tokens per prefill forward, over all rows (no press)
KV_NOTE = "bytes of the DynamicCache tensors after generation"


class HFRunner:
    def __init__(self) -> None:
        self.model = None

    def hello(self, args: dict) -> dict:
        versions = {}
        for name in ("torch", "transformers", "kvpress"):
            with contextlib.suppress(PackageNotFoundError):  # kvpress: only where it runs
                versions[name] = version(name)
        return {"system": "transformers", "pid": os.getpid(), "versions": versions}

    def load(self, args: dict) -> dict:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(args["n_threads"])
        start = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(
            args["model"], dtype=torch.float32, attn_implementation="sdpa").eval()
        return {"load_s": time.perf_counter() - start,
                "settings": {"dtype": "float32", "prefill_tokens_per_step": PREFILL_TOKENS,
                             "attn_implementation": self.model.config._attn_implementation}}

    def generate(self, args: dict) -> dict:
        press_spec = args.get("options", {}).get("press")
        start, stamps, token_ids, cache = self._greedy(
            [args["prompt_ids"]], args["max_new_tokens"], press_spec)
        return generation_reply(
            start=start, stamps=stamps, token_ids=token_ids[0], kv_bytes=_kv_bytes(cache),
            kv_note=KV_NOTE,
            extra={"cached_tokens": int(cache.get_seq_length()), "press": press_spec})

    def generate_batch(self, args: dict) -> dict:
        prompts = args["prompts"]
        if args.get("options", {}).get("press"):
            raise ValueError("generate_batch runs the full cache only (no press)")
        if len({len(ids) for ids in prompts}) != 1:
            raise ValueError("generate_batch needs prompts of one length (no padding)")
        start, stamps, token_ids, cache = self._greedy(prompts, args["max_new_tokens"], None)
        return batch_reply(start=start, stamps=[stamps] * len(prompts), token_ids=token_ids,
                           kv_bytes=_kv_bytes(cache) // len(prompts),
                           kv_note=f"{KV_NOTE}, divided by the rows")

    def _greedy(self, prompts: list[list[int]], max_new_tokens: int, press_spec: dict | None):
        """Every row of ``prompts`` (one length) prefilled, then ``max_new_tokens`` greedy
        tokens in lockstep -> (start, stamps, token ids per row, cache)."""
        import torch
        from transformers import DynamicCache

        if self.model is None:
            raise RuntimeError("generate before load")
        press = _make_press(press_spec) if press_spec else None
        ids = torch.tensor(prompts)  # (B, T)
        rows, length = ids.shape
        chunk = length if press else max(1, PREFILL_TOKENS // rows)
        # without a press the cache follows the config (sliding layers: their window only); a
        # press gets a plain one (see the module's docstring)
        cache = DynamicCache() if press else DynamicCache(config=self.model.config)
        with torch.inference_mode():
            start = time.perf_counter()
            with press(self.model) if press else contextlib.nullcontext():
                for begin in range(0, length, chunk):
                    out = self.model(input_ids=ids[:, begin : begin + chunk],
                                     past_key_values=cache, logits_to_keep=1)
            tokens = out.logits[:, -1].argmax(dim=-1)  # (B,)
            token_ids, stamps = [tokens.tolist()], [time.perf_counter()]
            position = torch.full((rows, 1), length)  # (B, 1)
            for step in range(max_new_tokens - 1):
                out = self.model(input_ids=tokens.view(rows, 1), past_key_values=cache,
                                 position_ids=position + step)
                tokens = out.logits[:, -1].argmax(dim=-1)  # (B,)
                token_ids.append(tokens.tolist())
                stamps.append(time.perf_counter())
        return start, stamps, [list(row) for row in zip(*token_ids, strict=True)], cache


def _kv_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (layer.keys, layer.values))


def _make_press(spec: dict):
    import kvpress

    press_class = getattr(kvpress, spec["name"], None)
    if press_class is None:
        raise ValueError(f"kvpress has no press {spec['name']!r}")
    return press_class(**spec.get("kwargs", {}))


if __name__ == "__main__":
    runner = HFRunner()
    serve({"hello": runner.hello, "load": runner.load, "generate": runner.generate,
           "generate_batch": runner.generate_batch})
