"""Parameter and KV counts from config.json, against hand counts and published sizes."""

import json

import pytest
from hwsim_tiny_models import TINY_DEEPSEEK, TINY_GEMMA3, TINY_LLAMA

from hwsim.config_loader import TARGETS_DIR, load_model_spec, parse_config, target_names
from hwsim.model_spec import MoeFfn

NO_HEAD_DIM = {k: v for k, v in TINY_LLAMA.items() if k != "head_dim"}


def test_tiny_llama_params_by_hand():
    model = parse_config("tiny", TINY_LLAMA)
    # attention: q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192; ffn 3*8*16 = 384; 2 norms of 8 = 16
    assert model.attention.params() == 192
    assert model.layer_params(model.layer_groups[0]) == 592
    # embedding 32*8 = 256, 2 layers 1184, head 256 + final norm 8 = 264
    assert model.params() == 256 + 1184 + 264
    # K and V of 1 head of dim 4, in 2 layers
    assert model.kv_elements_per_token() == 16


def test_tiny_deepseek_params_by_hand():
    model = parse_config("tiny-ds", TINY_DEEPSEEK)
    # q_a 8*4 + q_a_norm 4 + q_b 4*2*(2+2) = 68; kv_a 8*(4+2) + norm 4 = 52;
    # kv_b 4*2*(2+2) = 32; o 2*2*8 = 32
    assert model.attention.params() == 68 + 52 + 32 + 32
    dense, moe = model.layer_groups
    assert (dense.count, moe.count) == (1, 2)
    # expert 3*8*4 = 96; (4 routed + 1 shared) * 96 + router 4*8 = 512
    assert moe.ffn.params() == 512
    assert moe.ffn.routed_params() == 384
    # layers: 184 + 384 + 16 = 584 dense, 184 + 512 + 16 = 712 per MoE layer
    assert model.params() == 128 + 584 + 2 * 712 + 136
    # latent 4 + rope key 2 per layer, 3 layers
    assert model.kv_elements_per_token() == 18


def test_moe_touched_experts_uniform_routing():
    ffn = MoeFfn(hidden_size=8, expert_intermediate_size=4, n_routed=4, n_shared=1, top_k=2)
    assert ffn.touched_experts(1) == 2  # top-k exactly
    assert ffn.touched_experts(2) == 3  # 4 * (1 - (1/2)^2)
    # 1 token reads 2 of 4 routed experts of 3*8*4 = 96 params each
    assert ffn.routed_read_params(1) == 2 * 96


def test_replicated_params_by_hand():
    model = parse_config("tiny-ds", TINY_DEEPSEEK)
    # q_a 8x4 + its norm 4 = 36; kv_a 8x(4+2) + its norm 4 = 52
    assert model.attention.replicated_params() == 36 + 52
    dense, moe = model.layer_groups
    assert moe.ffn.replicated_params() == 4 * 8  # router: 4 experts x hidden 8
    assert dense.ffn.replicated_params() == 0
    assert model.replicated_layer_params(moe) == 88 + 32 + 2 * 8  # + the layer's two norms
    assert parse_config("tiny", TINY_LLAMA).attention.replicated_params() == 0
    deepseek = load_model_spec("deepseek-v3")
    # q_a 1536 x (7168 + 1) + kv_a 7168 x (512 + 64) + 512: 15.1 M of 187 M attention params
    assert deepseek.attention.replicated_params() == 11_011_584 + 4_129_280
    assert deepseek.layer_groups[1].ffn.replicated_params() == 256 * 7168


def test_published_parameter_counts():
    assert load_model_spec("llama-3.1-8b").params() == 8_030_261_248
    assert load_model_spec("llama-3.1-70b").params() == 70_553_706_496
    assert load_model_spec("llama-3.1-405b").params() == 405_853_388_800
    deepseek = load_model_spec("deepseek-v3")
    assert deepseek.params() == pytest.approx(671e9, rel=1e-3)
    # MLA caches 512 latent + 64 rope dims per layer: 61 * 576 elements per token
    assert deepseek.kv_elements_per_token() == 61 * 576
    assert [g.count for g in deepseek.layer_groups] == [3, 58]


def test_targets_shipped():
    assert {"llama-3.1-8b", "llama-3.1-70b", "deepseek-v3", "deepseek-r1",
            "gemma-3-270m", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"} <= set(target_names())


def test_tiny_gemma3_windowed_layers_by_hand():
    model = parse_config("tiny-gemma", TINY_GEMMA3)
    assert [(g.count, g.window) for g in model.layer_groups] == [(2, 4), (1, None), (2, 4)]
    assert model.params() == 256 + 5 * 592 + 8  # tied: the head is the final norm only
    # per layer K and V of 1 head of dim 4 = 8 elements a token; 4 windowed layers hold at
    # most 4 tokens, the global one all of them
    assert model.kv_elements(3) == 5 * 3 * 8
    assert model.kv_elements(10) == (4 * 4 + 10) * 8
    assert model.kv_elements_per_token() == 5 * 8
    # prefill of 6: the global layer 21 causal pairs, a windowed one 10 + 2 x 4 = 18
    assert model.prefill_pairs(6) == 21 + 4 * 18


def test_gemma3_270m_counts():
    model = load_model_spec("gemma-3-270m")
    assert model.params() == pytest.approx(268e6, rel=2e-3)  # "270M", 170M of them embedding
    assert [g.window for g in model.layer_groups] == [512, None] * 3
    per_token = 2 * 256  # K and V, 1 KV head of dim 256, per layer
    assert model.kv_elements(32768) == (3 * 32768 + 15 * 512) * per_token


def test_qwen25_coder_15b_counts():
    """1,543,714,304 parameters as published, less the Q/K/V biases hwsim does not model
    (28 layers x (1536 + 2 x 256)); 28 KiB of 16-bit K and V a token."""
    model = load_model_spec("qwen2.5-coder-1.5b")
    assert model.params() == 1_543_714_304 - 28 * (1536 + 2 * 256)
    assert model.kv_elements_per_token() * 2 == 28 * 1024
    assert [(g.count, g.window) for g in model.layer_groups] == [(28, None)]


def test_qwen25_coder_05b_counts():
    """The 1.5B's draft: 494,032,768 parameters as published, less the Q/K/V biases (24 layers x
    (896 + 2 x 128)); 12 KiB of 16-bit K and V a token."""
    model = load_model_spec("qwen2.5-coder-0.5b")
    assert model.params() == 494_032_768 - 24 * (896 + 2 * 128)
    assert model.kv_elements_per_token() * 2 == 12 * 1024


def test_qwen2_sliding_window_layers_are_refused():
    config = json.loads((TARGETS_DIR / "qwen2.5-coder-1.5b.json").read_text())
    with pytest.raises(ValueError, match="use_sliding_window is not modelled"):
        parse_config("windowed", {**config, "use_sliding_window": True})


def test_load_from_path_and_checkpoint_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    from_dir = load_model_spec(str(tmp_path))
    from_file = load_model_spec(str(tmp_path / "config.json"))
    assert from_dir.params() == from_file.params() == 1704
    assert from_dir.name == tmp_path.name


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**TINY_LLAMA, "model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({k: v for k, v in TINY_LLAMA.items() if k != "vocab_size"}, "'vocab_size'"),
        ({**TINY_LLAMA, "hidden_size": "8"}, "hidden_size must be a positive int"),
        ({**NO_HEAD_DIM, "num_attention_heads": "2"}, "wrong type"),  # hidden // "2"
        ({**TINY_LLAMA, "num_key_value_heads": 3}, "multiple of n_kv_heads"),
        ({**TINY_LLAMA, "num_hidden_layers": 0}, "count must be a positive int"),
    ],
)
def test_bad_configs_name_the_problem(config, message):
    with pytest.raises(ValueError, match=message):
        parse_config("bad", config)


def test_unknown_model_lists_targets():
    with pytest.raises(ValueError, match=r"not a shipped target \(deepseek-r1"):
        load_model_spec("no-such-model")


def test_the_served_qwen2_model_is_costed_from_its_own_config():
    """What the sn40l-sim decode back end reads: the GGUF's config, whose head is a tensor of its
    own (the Hugging Face checkpoint ties it)."""
    from snapstream.checkpoints import open_checkpoint

    served = parse_config("served", open_checkpoint("qwen2.5-coder-1.5b").config.to_hf_dict())
    shipped = load_model_spec("qwen2.5-coder-1.5b")
    assert served.params() == shipped.params() + 151936 * 1536
    assert served.kv_elements_per_token() == shipped.kv_elements_per_token()
