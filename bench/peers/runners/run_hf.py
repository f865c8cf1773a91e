"""transformers runner, with an optional kvpress press (run with the kvpress venv's python).

The transformers baseline shares the kvpress venv: the same transformers build, GGUF loader and
greedy loop then run with and without a press, so the press is the only difference between
the two systems (and one torch venv fewer to build and keep).

The model is read from the GGUF by transformers (dequantized to float32) with PyTorch's SDPA
attention (eager attention's score matrices would not fit at 32k tokens). Greedy decoding
is a plain loop over ``model(...)`` with explicit positions, as kvpress's own pipeline does: a
compressed cache is shorter than the text it covers, so positions cannot come from the cache
length. ``generate`` options: ``press`` = ``{"name": "SnapKVPress", "kwargs": {...}}`` or
absent for the full cache; any press class kvpress exports can be named.

Without a press the cache is built from the model's config, as transformers' own ``generate``
does: on a model with sliding-window layers (Gemma 3) those keep only their window. With one it
is a plain ``DynamicCache`` on every layer: on the sliding-window cache kvpress 0.5.5's
SnapKVPress (transformers 5.2) compresses the sliding layers too and the first decode step dies
("The size of tensor a (187) must match the size of tensor b (512) at non-singleton dimension
3", Gemma 3 270M, 2026-11-26); on a plain cache it compresses every layer to the budget and runs.
"""

from __future__ import annotations

import contextlib
import os
import time
from importlib.metadata import version
from pathlib import Path

from peer_protocol import generation_reply, serve


class HFRunner:
    def __init__(self) -> None:
        self.model = None

    def hello(self, args: dict) -> dict:
        versions = {name: version(name) for name in ("torch", "transformers", "kvpress")}
        return {"system": "transformers", "pid": os.getpid(), "versions": versions}

    def load(self, args: dict) -> dict:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(args["n_threads"])
        gguf = Path(args["model"])
        start = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
            attn_implementation="sdpa").eval()
        return {"load_s": time.perf_counter() - start,
                "settings": {"dtype": "float32",
                             "attn_implementation": self.model.config._attn_implementation}}

    def generate(self, args: dict) -> dict:
        import torch
        from transformers import DynamicCache

        if self.model is None:
            raise RuntimeError("generate before load")
        press_spec = args.get("options", {}).get("press")
        press = _make_press(press_spec) if press_spec else None
        ids = torch.tensor([args["prompt_ids"]])  # (1, T)
        # without a press the cache follows the config (sliding layers: their window only); a
        # press gets a plain one (see the module's docstring)
        cache = DynamicCache() if press else DynamicCache(config=self.model.config)
        with torch.inference_mode():
            start = time.perf_counter()
            with press(self.model) if press else contextlib.nullcontext():
                out = self.model(input_ids=ids, past_key_values=cache, logits_to_keep=1)
            token = out.logits[0, -1].argmax()
            token_ids, stamps = [int(token)], [time.perf_counter()]
            position = torch.tensor([[ids.shape[1]]])  # (1, 1)
            for step in range(args["max_new_tokens"] - 1):
                out = self.model(input_ids=token.view(1, 1), past_key_values=cache,
                                 position_ids=position + step)
                token = out.logits[0, -1].argmax()
                token_ids.append(int(token))
                stamps.append(time.perf_counter())
        kv_bytes = sum(t.numel() * t.element_size() for layer in cache.layers
                       for t in (layer.keys, layer.values))
        return generation_reply(
            start=start, stamps=stamps, token_ids=token_ids, kv_bytes=kv_bytes,
            kv_note="bytes of the DynamicCache tensors after generation",
            extra={"cached_tokens": int(cache.get_seq_length()), "press": press_spec})


def _make_press(spec: dict):
    import kvpress

    press_class = getattr(kvpress, spec["name"], None)
    if press_class is None:
        raise ValueError(f"kvpress has no press {spec['name']!r}")
    return press_class(**spec.get("kwargs", {}))


if __name__ == "__main__":
    runner = HFRunner()
    serve({"hello": runner.hello, "load": runner.load, "generate": runner.generate})
