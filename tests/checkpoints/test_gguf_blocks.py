"""GGUF's quantized blocks served as int4/int8 codes: exactly the file's values (gguf's own
dequantization), through the loader (fused projections, Llama's permuted rows), tensor by tensor
within 1.5x the served model's memory; files we cannot serve refused with one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.gguf_blocks import BLOCK_TYPES, decode_rows
from snapstream.cpu import matmul_dtype_name
from snapstream.engine import Engine
from snapstream.quant import GroupedCodes, Int4Linear, Int8Linear, quantized_linear
from tests.tiny_models import random_model, tiny_config, write_gguf

T = gguf.GGMLQuantizationType
ROOT = Path(__file__).resolve().parents[2]
# where each type keeps its float16 d (and dmin / m): set to finite values of either sign
HALVES = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
          T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def random_blocks(kind: T, rows: int, blocks_per_row: int, seed: int = 0) -> np.ndarray:
    """(rows, bytes) of random codes and scales, float16 fields finite over 6 decades."""
    type_size = gguf.GGML_QUANT_SIZES[kind][1]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows * blocks_per_row, type_size), dtype=np.uint8)
    for at in HALVES[kind]:
        values = rng.standard_normal(len(data)) * np.exp(rng.uniform(-9, 3, len(data)))
        data[:, at:at + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return data.reshape(rows, -1)


def as_codes(kind: T, data: np.ndarray) -> GroupedCodes:
    got = decode_rows(kind, data)
    return GroupedCodes(torch.from_numpy(got.codes), torch.from_numpy(got.scales),
                        None if got.offsets is None else torch.from_numpy(got.offsets),
                        BLOCK_TYPES[kind].bits)


def reference(kind: T, data: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(data, kind).reshape(len(data), -1))


@pytest.mark.parametrize("kind", list(BLOCK_TYPES), ids=lambda k: k.name)
def test_a_types_blocks_become_codes_that_dequantize_to_ggufs_values(kind):
    data = random_blocks(kind, rows=40, blocks_per_row=2)
    layer = quantized_linear(as_codes(kind, data))
    assert isinstance(layer, Int4Linear if BLOCK_TYPES[kind].bits == 4 else Int8Linear)
    # every weight equal (as values: -0.0 == 0.0), not merely close
    assert torch.equal(layer.dequantized(), reference(kind, data))
    # the legacy types' d and m are float16 values; the K-quants' d * sc need float32
    assert layer.scales.dtype == (torch.float32 if kind.name.endswith("_K") else torch.float16)


def test_a_fused_projection_of_mixed_types_stays_exact():
    """q Q4_K (int4, groups of 32), k Q6_K (int8, groups of 16), v Q5_0 (int8, no offsets):
    one layer in int8 codes, groups of 16, equal to the three references stacked."""
    kinds = (T.Q4_K, T.Q6_K, T.Q5_0)
    datas = [random_blocks(kind, rows=16 * (i + 1),
                           blocks_per_row=256 // gguf.GGML_QUANT_SIZES[kind][0], seed=i)
             for i, kind in enumerate(kinds)]
    layer = quantized_linear(GroupedCodes.stacked(
        [as_codes(kind, data) for kind, data in zip(kinds, datas, strict=True)]))
    assert isinstance(layer, Int8Linear) and layer.scales.shape[1] == 256 // 16
    want = torch.cat([reference(kind, data) for kind, data in zip(kinds, datas, strict=True)])
    assert torch.equal(layer.dequantized(), want)


MIXED = {"attn_q.weight": T.Q4_K, "attn_k.weight": T.Q6_K, "attn_v.weight": T.Q5_0,
         "attn_output.weight": T.Q5_K, "ffn_gate.weight": T.Q4_0, "ffn_up.weight": T.Q5_1,
         "ffn_down.weight": T.Q4_1, "token_embd.weight": T.Q8_0}


@pytest.mark.parametrize("tied", [False, True])
def test_a_files_layers_are_its_own_weights_and_track_the_float32_reference(tmp_path, tied):
    """Loaded with dtype gguf, each layer's weight is the float32 reference's (the file
    dequantized by gguf, Llama's Q/K rows un-permuted) bit for bit; logits differ only by the
    prompt's activations in the CPU's GEMM dtype (bfloat16 at most)."""
    config = tiny_config(hidden_size=256, intermediate_size=512, head_dim=64,
                         tie_word_embeddings=tied, max_position_embeddings=4096)
    path = write_gguf(tmp_path / "m.gguf", random_model(config),
                      {**MIXED, "output.weight": T.Q6_K})
    assert open_checkpoint(path).native_format == "gguf"
    blocks, floats = Engine.from_pretrained(path), Engine.from_pretrained(path, dtype="float32")
    for layer, ref in zip(blocks.model.model.layers, floats.model.model.layers, strict=True):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                     "mlp.down_proj"):
            got = layer.get_submodule(name)
            assert torch.equal(got.dequantized(), ref.get_submodule(name).weight), name
    assert torch.equal(blocks.model.lm_head.dequantized(), floats.model.lm_head.weight)
    assert blocks.kv_dtype == torch.int8
    ids = list(range(40, 90))
    got = blocks.prefill(ids, _full(), 1).logits
    want = floats.prefill(ids, _full(), 1).logits
    assert blocks.prefill_dtype == getattr(torch, matmul_dtype_name())
    # measured: 2.1% with a float32 prompt, under 2% in bfloat16: the int8 layers' 8-bit
    # activations dominate; a wrong scale or row order is off by ~100%
    assert float((got - want).norm() / want.norm()) < 0.03


def _full():
    from snapstream.policy import CachePolicy

    return CachePolicy(kind="full")


def test_dtype_gguf_needs_a_gguf(tiny_model_dir):
    with pytest.raises(ValueError, match=r"own quantized blocks.*use dtype auto"):
        Engine.from_pretrained(tiny_model_dir, dtype="gguf")


def _one_tensor_gguf(path, arch: str, name: str, data: np.ndarray, raw_dtype=None):
    """A GGUF of ``arch`` with one block and the one tensor ``name``."""
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(1)
    writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_unsupported_tensor_type_is_refused_naming_it_and_the_supported_ones(tmp_path):
    type_size = gguf.GGML_QUANT_SIZES[T.Q8_K][1]
    path = _one_tensor_gguf(tmp_path / "q8k.gguf", "llama", "blk.0.attn_q.weight",
                            np.zeros((4, type_size), np.uint8), T.Q8_K)
    with pytest.raises(ValueError) as info:
        Engine.from_pretrained(path)
    message = str(info.value)
    assert str(path) in message and "blk.0.attn_q.weight is Q8_K" in message
    assert "Q4_K" in message and "Q6_K" in message and "\n" not in message


def test_an_unsupported_architecture_is_refused_naming_it_and_the_supported_ones(tmp_path):
    path = _one_tensor_gguf(tmp_path / "mamba.gguf", "mamba", "token_embd.weight",
                            np.zeros((8, 32), np.float32))
    with pytest.raises(ValueError) as info:
        Engine.from_pretrained(path)
    message = str(info.value)
    assert "architecture 'mamba' is not supported" in message
    assert "llama" in message and "gemma3" in message and "\n" not in message


LOAD_PEAK = """
import json, sys
from pathlib import Path
import torch
from snapstream.checkpoints import open_checkpoint
from snapstream.loader import load_model
from snapstream.model import Transformer

def status(key):  # bytes
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(key))
    return int(line.split()[1]) * 1024

checkpoint = open_checkpoint(sys.argv[1])
with torch.device("meta"):  # imports torch's meta machinery (~80 MB, once) outside the measure
    Transformer(checkpoint.config)
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) restarts from here
before = status("VmRSS:")
model = load_model(checkpoint, keep_blocks=sys.argv[2] == "blocks")
size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
print(json.dumps({"before": before, "peak": status("VmHWM:"), "model": size}))
"""


def load_peak(path: Path, how: str) -> dict[str, int]:
    """RSS before loading, its peak while loading and the loaded model's bytes, in a fresh
    process; ``how``: "blocks" (dtype gguf) or "float32"."""
    run = subprocess.run([sys.executable, "-c", LOAD_PEAK, str(path), how], cwd=ROOT,
                         check=True, capture_output=True, text=True)
    return json.loads(run.stdout)


def test_loading_streams_within_one_and_a_half_times_the_served_model(tmp_path):
    """Peak RSS while loading a ~75 MB Q4_K/Q6_K model (its growth over the process before
    loading) stays within 1.5x the model's bytes (measured 1.24x): no float32 copy (4x), no
    file held beside it. The float32 load of the same file, measured alike, grows by 7x."""
    config = tiny_config(hidden_size=512, intermediate_size=2048, num_layers=24, num_heads=4,
                         num_kv_heads=2, head_dim=128, max_position_embeddings=4096)
    qtypes = {name: T.Q4_K for name in ("attn_q.weight", "attn_k.weight", "attn_output.weight",
                                        "ffn_gate.weight", "ffn_up.weight")}
    path = write_gguf(tmp_path / "m.gguf", random_model(config),
                      {**qtypes, "attn_v.weight": T.Q6_K, "ffn_down.weight": T.Q6_K})
    got = load_peak(path, "blocks")
    assert got["model"] > 70e6
    assert got["peak"] - got["before"] <= 1.5 * got["model"], got
    dequantized = load_peak(path, "float32")  # the measure sees a float32 load's growth
    assert dequantized["peak"] - dequantized["before"] > 4 * got["model"], dequantized
