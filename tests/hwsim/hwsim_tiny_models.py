"""Tiny configs whose byte and FLOP counts the tests compute by hand."""

# hidden 8, 2 query heads of dim 4 sharing 1 KV head, SwiGLU 16, 2 layers, vocab 32, untied.
TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "intermediate_size": 16,
    "num_hidden_layers": 2,
    "vocab_size": 32,
    "tie_word_embeddings": False,
}

# MLA (2 heads, q_lora 4, kv_lora 4, nope 2, rope 2, v 2) with 1 dense layer (16) then 2 MoE
# layers (4 routed experts of width 4, top-2, 1 shared), vocab 16.
TINY_DEEPSEEK = {
    "model_type": "deepseek_v3",
    "hidden_size": 8,
    "num_attention_heads": 2,
    "q_lora_rank": 4,
    "kv_lora_rank": 4,
    "qk_nope_head_dim": 2,
    "qk_rope_head_dim": 2,
    "v_head_dim": 2,
    "intermediate_size": 16,
    "moe_intermediate_size": 4,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "num_hidden_layers": 3,
    "vocab_size": 16,
}

# Gemma 3 in miniature: TINY_LLAMA's shapes, tied, 5 layers: 2 sliding (window 4), 1 global,
# 2 sliding.
TINY_GEMMA3 = {
    **TINY_LLAMA,
    "model_type": "gemma3_text",
    "num_hidden_layers": 5,
    "tie_word_embeddings": True,
    "sliding_window": 4,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                    "sliding_attention", "sliding_attention"],
}
