"""The registry of peer systems: name -> venv recipe, runner script and per-system options.

A system is one configuration of a peer (OpenVINO GenAI with and without cache eviction are two
systems sharing a venv). ``venv=None`` runs the runner with this project's own interpreter:
that is where snapstream itself goes (``run_snapstream.py``, in process, full and snapstream
policies), speaking the same protocol as the peers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.peers import recipes
from bench.peers.models import hf_model_dir, openvino_ir
from bench.peers.runners import RUNNERS
from bench.peers.venvs import Echo, Venv, VenvSpec


@dataclass(frozen=True)
class PeerBudget:
    """The KV budget that systems with a fixed-size or compressed cache get, in tokens:
    ``n_sink`` first tokens, ``n_recent`` last ones, the rest chosen by the system's scoring
    (SnapKV) over an ``observation`` window of the last prompt queries, smoothed by a
    ``kernel``-wide pooling
    where the system has one. By default the model's policy file (``peer_model``; the sweep's
    choice, docs/accuracy.md)."""

    total: int
    n_sink: int
    n_recent: int
    observation: int
    kernel: int

    def __post_init__(self) -> None:
        if self.n_sink + self.n_recent >= self.total:
            raise ValueError(f"budget total {self.total} must exceed n_sink + n_recent "
                             f"({self.n_sink} + {self.n_recent})")
        if self.observation < 1:
            raise ValueError(f"budget observation must be ≥ 1, got {self.observation}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"budget kernel must be odd and ≥ 1, got {self.kernel}")


# (model GGUF, venv or None, echo) -> the model path the runner loads
Prepare = Callable[[Path, Venv | None, Echo], Path]
LoadOptions = Callable[[PeerBudget], dict]
# (prompt length, budget) -> generate options
GenerateOptions = Callable[[int, PeerBudget], dict]


def _gguf(gguf: Path, venv: Venv | None, echo: Echo) -> Path:
    return gguf


def _no_options(*_: object) -> dict:
    return {}


def _no_env(venv: Venv | None) -> dict[str, str]:
    return {}


def _this_checkout(venv: Venv | None) -> dict[str, str]:
    """snapstream's runners import the checkout that runs the benchmark (a git worktree's code,
    not the one the venv's editable install points at)."""
    return {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}


@dataclass(frozen=True)
class PeerSystem:
    name: str
    label: str  # what the doc calls it: library, precision, cache
    venv: VenvSpec | None
    runner: str  # a script in runners/
    prepare: Prepare = _gguf
    load_options: LoadOptions = _no_options
    generate_options: GenerateOptions = _no_options
    runner_env: Callable[[Venv | None], dict[str, str]] = _no_env

    def __post_init__(self) -> None:
        if not (RUNNERS / self.runner).is_file():
            raise ValueError(f"PeerSystem {self.name!r}: no runner {RUNNERS / self.runner}")


SYSTEMS: dict[str, PeerSystem] = {}


def register(system: PeerSystem) -> PeerSystem:
    if system.name in SYSTEMS:
        raise ValueError(f"peer system {system.name!r} is already registered")
    SYSTEMS[system.name] = system
    return system


def get_system(name: str) -> PeerSystem:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown peer system {name!r}; known: {', '.join(SYSTEMS)}") from None


def compression_ratio(num_tokens: int, keep: int) -> float:
    """kvpress's ``compression_ratio`` that keeps exactly ``keep`` of ``num_tokens`` (it keeps
    ``int(num_tokens * (1 - ratio))``; the half token absorbs float rounding)."""
    if num_tokens <= keep:
        return 0.0
    return 1.0 - (keep + 0.5) / num_tokens


OPENVINO_BLOCK = 32


def _llama_env(venv: Venv | None) -> dict[str, str]:
    return {"LLAMA_CPP_LIB_PATH": str(venv.path / recipes.LLAMA_BUILD_DIR / "bin")}


def _openvino_model(gguf: Path, venv: Venv | None, echo: Echo) -> Path:
    return openvino_ir(venv, gguf, echo)


def _hf_model(gguf: Path, venv: Venv | None, echo: Echo) -> Path:
    return hf_model_dir(venv, gguf, echo)


def _eviction(budget: PeerBudget) -> dict:
    # OpenVINO evicts whole KV blocks: start and recent sizes must be multiples of the block
    # size (32 tokens here) and the start may not be empty, so the sinks take at least one block
    start_size = max(1, -(-budget.n_sink // OPENVINO_BLOCK)) * OPENVINO_BLOCK
    return {"cache_eviction": {"start_size": start_size, "recent_size": budget.n_recent,
                               "max_cache_size": budget.total, "aggregation_mode": "NORM_SUM",
                               "snapkv_window_size": budget.observation}}


def _snapstream_policy(num_tokens: int, budget: PeerBudget) -> dict:
    n_topk = budget.total - budget.n_sink - budget.n_recent
    return {"policy": {"kind": "snapstream", "n_sink": budget.n_sink, "n_topk": n_topk,
                       "n_recent": budget.n_recent, "observation": budget.observation,
                       "kernel": budget.kernel}}


def _full_policy(num_tokens: int, budget: PeerBudget) -> dict:
    return {"policy": {"kind": "full"}}


def _snapkv_press(num_tokens: int, budget: PeerBudget) -> dict:
    kwargs = {"compression_ratio": compression_ratio(num_tokens, budget.total),
              "window_size": budget.observation, "kernel_size": budget.kernel}
    return {"press": {"name": "SnapKVPress", "kwargs": kwargs}}


register(PeerSystem(
    name="llama.cpp",
    label="llama.cpp (llama-cpp-python), the GGUF as it is, f16 KV, full cache (on a model "
          "with sliding-window layers those hold its SWA cache: the window + one 512-token "
          "ubatch, padded to 256)",
    venv=recipes.LLAMACPP, runner="run_llamacpp.py", runner_env=_llama_env))
register(PeerSystem(
    name="openvino", label="OpenVINO GenAI ContinuousBatchingPipeline, fp32 IR, full cache",
    venv=recipes.OPENVINO, runner="run_openvino.py", prepare=_openvino_model))
register(PeerSystem(
    name="openvino-evict",
    label="OpenVINO GenAI ContinuousBatchingPipeline, fp32 IR, cache eviction to the budget "
          "(SnapKV scores at prefill, NORM_SUM after; sinks rounded up to one 32-token block)",
    venv=recipes.OPENVINO, runner="run_openvino.py", prepare=_openvino_model,
    load_options=_eviction))
register(PeerSystem(
    name="transformers",
    label="transformers, GGUF dequantized to fp32, SDPA, DynamicCache (full; on a model with "
          "sliding-window layers those keep their window), the prompt in chunks of 4096 tokens",
    venv=recipes.KVPRESS, runner="run_hf.py", prepare=_hf_model))
register(PeerSystem(
    name="kvpress-snapkv",
    label="kvpress SnapKVPress on transformers, fp32: the prompt's cache compressed to the "
          "budget (its SnapKV window plus the top-scored tokens; no sinks), growing in decode "
          "(on a model with sliding-window layers a plain DynamicCache: those are compressed "
          "too)",
    venv=recipes.KVPRESS, runner="run_hf.py", prepare=_hf_model,
    generate_options=_snapkv_press))
register(PeerSystem(
    name="snapstream",
    label="snapstream in process as served (Engine: prefill + SnapKV, then the static "
          "ring-buffer decode step), the GGUF's blocks in snapstream's default format for it "
          "(4-bit groups as int4 codes, 5- to 8-bit ones as int8; snapstream's kernels, the "
          "dequantized weight's GEMM from 128 rows of a prompt on), prompt activations in the "
          "CPU's GEMM dtype (bfloat16 with AVX512-BF16 or AMX, else float32), "
          "float32 decode activations, int8 KV (codes + a float32 scale per slot and KV head) "
          "of the budget's size whatever the length (sliding-window layers: a ring of the "
          "window)",
    venv=None, runner="run_snapstream.py", generate_options=_snapstream_policy,
    runner_env=_this_checkout))
register(PeerSystem(
    name="snapstream-bf16",
    label="snapstream in process as `snapstream`, the KV cache in bfloat16 (`--kv-dtype "
          "bfloat16`: 2 bytes a K/V element, where the default int8 holds codes and a float32 "
          "scale per slot and KV head)",
    venv=None, runner="run_snapstream.py", load_options=lambda budget: {"kv_dtype": "bfloat16"},
    generate_options=_snapstream_policy, runner_env=_this_checkout))
register(PeerSystem(
    name="snapstream-fp8",
    label="snapstream in process as `snapstream`, the KV cache in fp8 e4m3 (`--kv-dtype "
          "float8_e4m3fn`: 1 byte a K/V element and no scale, a quarter of float32's bytes "
          "exactly)",
    venv=None, runner="run_snapstream.py",
    load_options=lambda budget: {"kv_dtype": "float8_e4m3fn"},
    generate_options=_snapstream_policy, runner_env=_this_checkout))
register(PeerSystem(
    name="snapstream-fp32",
    label="snapstream in process, the GGUF dequantized to float32 (weights, activations, KV)",
    venv=None, runner="run_snapstream.py", load_options=lambda budget: {"dtype": "float32"},
    generate_options=_snapstream_policy, runner_env=_this_checkout))
register(PeerSystem(
    name="snapstream-full",
    label="snapstream in process as served, full policy (every prompt token kept, the KV "
          "sized to the prompt + new tokens)",
    venv=None, runner="run_snapstream.py", generate_options=_full_policy,
    runner_env=_this_checkout))
