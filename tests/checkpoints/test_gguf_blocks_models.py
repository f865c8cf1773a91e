"""The two shipped models served from their GGUF blocks (dtype auto = gguf) against their
float32 dequantized reference: the same weights bit for bit, and close outputs (slow tier:
both formats of a model load)."""

from __future__ import annotations

import inspect
import statistics

import pytest
import torch

from snapstream import Engine
from snapstream.quant import QuantizedLinear

pytestmark = pytest.mark.slow
MODELS = ("smollm2-135m", "gemma3-270m")
PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


@pytest.fixture(scope="module", params=MODELS)
def engines(request) -> tuple[Engine, Engine]:
    blocks = Engine.from_pretrained(request.param)  # auto: the file's own blocks
    return blocks, Engine.from_pretrained(request.param, dtype="float32")


def test_every_quantized_weight_is_the_files_value(engines):
    blocks, floats = engines
    for layer, ref in zip(blocks.model.model.layers, floats.model.model.layers, strict=True):
        for name in PROJECTIONS:
            got = layer.get_submodule(name)
            assert isinstance(got, QuantizedLinear)
            assert torch.equal(got.dequantized(), ref.get_submodule(name).weight), name
    # the tied Q8_0 embedding is the head, int8 codes with float16 scales
    assert torch.equal(blocks.model.lm_head.dequantized(), floats.model.lm_head.weight)
    assert blocks.model.lm_head.scales.dtype == torch.float16


def test_logits_track_the_float32_reference(engines):
    """Teacher-forced over 512 tokens of Python source: the only difference is the kernels'
    bfloat16 activations (prefill: the bfloat16 GEMM)."""
    blocks, floats = engines
    ids = floats.tokenizer.encode(inspect.getsource(statistics))[:512]

    def logits(engine: Engine) -> torch.Tensor:
        model = engine.model
        with torch.no_grad():
            hidden = model(torch.tensor([ids]), torch.arange(len(ids))[None],
                           model.causal_attend)
            return model.logits(hidden[0]).float()  # (P, V)

    got, want = logits(blocks), logits(floats)
    kl = torch.nn.functional.kl_div(got.log_softmax(-1), want.log_softmax(-1), log_target=True,
                                    reduction="batchmean")
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean()
    assert kl < 0.02, kl  # measured: see docs/model.md
    assert agree > 0.9, agree
