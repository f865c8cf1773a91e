"""`snapstream bench engine`: decode step time vs context, KV bytes, prefill speed, and the same
through transformers on the same weights, for the served model (default SmolLM2-135M-Instruct)."""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from snapstream.compress import slot_indices
from snapstream.config import ModelConfig
from snapstream.decode import Decoder
from snapstream.engine import Engine
from snapstream.kvcache import BatchCache, ModelLayout, kv_bytes_per_token
from snapstream.kvquant import kv_codec
from snapstream.model import Transformer, to_hf_state
from snapstream.policy import CacheLayout, CachePolicy

GIB = 2**30


@dataclass(frozen=True)
class EngineBenchConfig:
    contexts: tuple[int, ...] = (1024, 2048, 4096, 8192)
    batches: tuple[int, ...] = (1, 16)
    policy: CachePolicy = field(default_factory=lambda: CachePolicy(n_sink=4, n_topk=764,
                                                                   n_recent=256))  # budget 1024
    steps: int = 6
    warmup: int = 2
    prefill_len: int = 8192
    memory_limit_gib: float = 14.0  # points whose KV cache needs more are skipped
    with_transformers: bool = True
    seed: int = 0


@dataclass(frozen=True)
class DecodePoint:
    batch: int
    context: int
    full_s: float | None
    snapstream_s: float | None
    transformers_s: float | None
    snapstream_ref_s: float  # snapstream at the shortest context, stepped in the same rounds


def filled_cache(config: ModelConfig, layout: CacheLayout, batch: int, context: int,
                 dtype: torch.dtype = torch.float32) -> BatchCache:
    """A pool whose every row holds a ``context``-token sequence as the layout would keep it
    (a hybrid model's sliding layers: the last window of it)."""
    cache = BatchCache(config, ModelLayout.build(config.attention_windows, layout), batch, dtype)
    for group in cache.groups:
        num_slots = group.k.shape[-2]
        tile = kv_codec(dtype).encode(torch.randn(min(num_slots, 4096), config.head_dim))
        for tensor in (group.k, group.v):
            flat = tensor.view(-1, tile.shape[-1])  # (slots, W)
            for start in range(0, flat.shape[0], tile.shape[0]):
                chunk = flat[start : start + tile.shape[0]]
                chunk.copy_(tile[: chunk.shape[0]])
        kept_layout = group.group.layout
        held = min(context, kept_layout.n_kept)
        kept = torch.cat((torch.arange(kept_layout.ring_start),
                          torch.arange(context - held + kept_layout.ring_start, context))
                         ) if held < context else torch.arange(context)
        group.filled[:, slot_indices(kept_layout, kept)] = True
    return cache


def interleaved_medians(steppers: dict[str, Callable[[int], None]], steps: int,
                        warmup: int) -> dict[str, float]:
    """Median step time of each system, stepping them round-robin so that load from other
    processes falls on all of them alike (ratios stay meaningful on a shared machine)."""
    times: dict[str, list[float]] = {name: [] for name in steppers}
    for i in range(warmup + steps):
        for name, step in steppers.items():
            start = time.perf_counter()
            step(i)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def ours_stepper(model, layout, batch, context, compile=False,
                 dtype: torch.dtype = torch.float32) -> Callable[[int], None]:
    cache = filled_cache(model.config, layout, batch, context, dtype)
    decoder = Decoder(model, cache, compile=compile)
    tokens = torch.zeros(batch, dtype=torch.long)
    return lambda i: decoder.step(tokens, torch.full((batch,), context + i))


def hf_stepper(hf_model, config: ModelConfig, batch: int, context: int) -> Callable[[int], None]:
    from transformers import DynamicCache

    cache = DynamicCache(config=hf_model.config)
    shape = (batch, config.num_kv_heads, context, config.head_dim)
    for layer in range(config.num_layers):
        cache.update(torch.randn(shape), torch.randn(shape), layer)
    tokens = torch.zeros(batch, 1, dtype=torch.long)

    @torch.no_grad()
    def step(i: int) -> None:
        hf_model(input_ids=tokens, past_key_values=cache, use_cache=True,
                 position_ids=torch.full((batch, 1), context + i))

    return step


def fits(config: ModelConfig, batch: int, slots: int, factor: float,
         cfg: EngineBenchConfig) -> bool:
    return batch * slots * kv_bytes_per_token(config, torch.float32) * factor < (
        cfg.memory_limit_gib * GIB)


def load_transformers(model: Transformer):
    """The same weights in transformers' own Llama implementation."""
    from transformers import AutoModelForCausalLM

    config = model.config
    state = {k: v.detach().contiguous() for k, v in to_hf_state(model.state_dict(), config).items()
             if not (config.tie_word_embeddings and k == "lm_head.weight")}
    with tempfile.TemporaryDirectory() as tmp:
        save_file(state, Path(tmp) / "model.safetensors", metadata={"format": "pt"})
        (Path(tmp) / "config.json").write_text(json.dumps(config.to_hf_dict()))
        return AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()


def decode_points(model, hf_model, cfg: EngineBenchConfig) -> list[DecodePoint]:
    points = []
    grid = [(b, c) for b in cfg.batches for c in cfg.contexts]
    snap_layout = cfg.policy.layout(1, 1)
    for batch, context in tqdm(grid, desc="decode step vs context", unit="point"):
        full_layout = CachePolicy(kind="full").layout(context, cfg.warmup + cfg.steps)
        steppers = {"snapstream": ours_stepper(model, snap_layout, batch, context),
                    "snapstream_ref": ours_stepper(model, snap_layout, batch, cfg.contexts[0])}
        if fits(model.config, batch, full_layout.budget, 1.0, cfg):
            steppers["full"] = ours_stepper(model, full_layout, batch, context)
        if hf_model is not None and fits(model.config, batch, context, 2.2 + (2.0 * (
                "full" in steppers)), cfg):
            steppers["transformers"] = hf_stepper(hf_model, model.config, batch, context)
        medians = interleaved_medians(steppers, cfg.steps, cfg.warmup)
        points.append(DecodePoint(batch, context, medians.get("full"), medians["snapstream"],
                                  medians.get("transformers"), medians["snapstream_ref"]))
        del steppers
    return points


def prefill_figures(engine: Engine, hf_model, cfg: EngineBenchConfig) -> dict[str, float]:
    ids = torch.randint(0, engine.config.vocab_size, (cfg.prefill_len,),
                        generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    engine.prefill(ids[:512], cfg.policy, 1)  # warm-up
    ours, select, theirs = [], [], []
    for _ in range(2):  # interleaved, best of two
        result = engine.prefill(ids, cfg.policy, 1)
        ours.append(result.prefill_s)
        select.append(result.select_s)
        if hf_model is not None:
            start = time.perf_counter()
            hf_model.generate(torch.tensor([ids]), max_new_tokens=1, do_sample=False)
            theirs.append(time.perf_counter() - start)
    best = ours.index(min(ours))
    figures = {"ours_prefill_s": ours[best], "ours_select_s": select[best]}
    if theirs:
        figures["transformers_prefill_s"] = min(theirs)
    return figures


def compile_figures(model, cfg: EngineBenchConfig) -> dict[str, float]:
    layout = cfg.policy.layout(1, 1)
    out = {}
    for batch in cfg.batches:
        medians = interleaved_medians({
            "eager": ours_stepper(model, layout, batch, 4096),
            "compiled": ours_stepper(model, layout, batch, 4096, compile=True)},
            cfg.steps, cfg.warmup + 2)
        out[f"eager_b{batch}_s"], out[f"compiled_b{batch}_s"] = medians["eager"], medians[
            "compiled"]
    return out


def run_engine_bench(cfg: EngineBenchConfig, engine: Engine) -> dict:
    torch.set_grad_enabled(False)
    too_long = [c for c in (*cfg.contexts, cfg.prefill_len) if c > engine.context_len]
    if too_long:
        raise ValueError(f"contexts {too_long} exceed the model's context of "
                         f"{engine.context_len} tokens")
    model = engine.model
    hf_model = load_transformers(model) if cfg.with_transformers else None
    points = decode_points(model, hf_model, cfg)
    return {"config": asdict(cfg), "model": engine.name,
            "params": sum(p.numel() for p in model.parameters()),
            "decode": [asdict(p) for p in points],
            "prefill": prefill_figures(engine, hf_model, cfg),
            "compile": compile_figures(model, cfg)}
