"""The shipped checkpoint loads through the same loader as any other and serves by default."""

from __future__ import annotations

from snapstream.config import EMBEDDED_MODEL
from snapstream.engine import Engine
from snapstream.policy import CachePolicy


def test_embedded_checkpoint_is_small_gqa_and_in_hf_layout():
    files = {p.name for p in EMBEDDED_MODEL.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= files
    assert sum(p.stat().st_size for p in EMBEDDED_MODEL.iterdir()) <= 20 * 2**20
    engine = Engine.from_pretrained()  # no path: the embedded model is the default
    assert engine.config.num_kv_heads < engine.config.num_heads
    assert engine.context_len >= 2048
    assert engine.tokenizer.decode(engine.tokenizer.encode("Answer: 42")) == "Answer: 42"


def test_embedded_model_generates_the_same_with_full_and_uncompressed_snapstream():
    engine = Engine.from_pretrained()
    prompt = "The pass key is 48213. Remember it.\nWhat is the passkey?\nAnswer: "
    full = engine.generate(prompt, 8, policy=CachePolicy(kind="full"))
    roomy = engine.generate(prompt, 8, policy=CachePolicy(n_sink=4, n_topk=60, n_recent=64))
    assert full.token_ids == roomy.token_ids  # nothing evicted: identical to the full cache
