"""Tiny random checkpoints written to temporary paths: Hugging Face directories and GGUF files.

Both carry a real byte-level BPE tokenizer (256 byte tokens, a few merges, ChatML special
tokens) and SmolLM2's ChatML chat template, so every path a real model takes (tokenizer.json or
GGUF metadata, chat rendering, end-of-turn ids) runs on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from snapstream.config import FULL, SLIDING, ModelConfig, RopeConfig
from snapstream.model import Transformer, to_hf_state
from snapstream.tokenizer import Tokenizer as SnapstreamTokenizer

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = (("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"))
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of each byte value, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    spelled, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            spelled[byte] = chr(byte)
        else:
            spelled[byte] = chr(256 + extra)
            extra += 1
    return [spelled[b] for b in range(256)]


def tiny_vocab() -> list[str]:
    return [*byte_alphabet(), *("".join(m) for m in MERGES), *SPECIAL_TOKENS]


TINY_VOCAB_SIZE = len(tiny_vocab())
EOS_ID = tiny_vocab().index("<|im_end|>")
ENDOFTEXT_ID = tiny_vocab().index("<|endoftext|>")


def tiny_tokenizer() -> Tokenizer:
    vocab = {token: i for i, token in enumerate(tiny_vocab())}
    inner = Tokenizer(models.BPE(vocab=vocab, merges=list(MERGES)))
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    inner.add_special_tokens([AddedToken(t, special=True, normalized=False)
                              for t in SPECIAL_TOKENS])
    return inner


def tiny_snapstream_tokenizer() -> SnapstreamTokenizer:
    """The tiny tokenizer as the engine and the router use it (no chat template)."""
    return SnapstreamTokenizer(inner=tiny_tokenizer(), bos_token_id=None,
                               eos_token_ids=(EOS_ID, ENDOFTEXT_ID))


def tiny_config(**overrides) -> ModelConfig:
    fields = dict(vocab_size=TINY_VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  max_position_embeddings=131072)
    fields.update(overrides)
    return ModelConfig(**fields)


def random_model(config: ModelConfig, seed: int = 0, dtype=torch.float32) -> Transformer:
    """Random weights with enough spread that attention is far from uniform."""
    torch.manual_seed(seed)
    model = Transformer(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, 0.08 if "embed" not in name else 1.0)
    return model.to(dtype).eval()


def write_tokenizer_files(directory: Path, chat_template: str | None = CHATML) -> None:
    tiny_tokenizer().save(str(directory / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "bos_token": None}
    if chat_template:
        config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def tiny_gemma3_config(**overrides) -> ModelConfig:
    """Gemma 3 in miniature: 5 layers (sliding, sliding, global, sliding, sliding) with a
    sliding window of 16, its own RoPE base, scaled embeddings and a query scale of its own."""
    fields = dict(model_type="gemma3", hidden_act="gelu_tanh", num_layers=5,
                  layer_types=(SLIDING, SLIDING, FULL, SLIDING, SLIDING), sliding_window=16,
                  local_rope=RopeConfig(theta=1e4), rope=RopeConfig(theta=1e6),
                  embed_scale=64**0.5, query_scale=24**-0.5, tie_word_embeddings=True,
                  max_position_embeddings=2048)
    return tiny_config(**{**fields, **overrides})


def write_hf_dir(directory: Path, model: Transformer, chat_template: str | None = CHATML
                 ) -> Path:
    """Our random model as a Hugging Face checkpoint directory with the tiny tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    tied = model.config.tie_word_embeddings
    hf_state = to_hf_state(model.state_dict(), model.config)
    state = {k: v.detach().contiguous() for k, v in hf_state.items()
             if not (tied and k == "lm_head.weight")}
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    config = {**model.config.to_hf_dict(), "eos_token_id": EOS_ID, "torch_dtype": "float32"}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer_files(directory, chat_template)
    return directory


def write_tiny_model(directory: Path, seed: int = 0, context: int = 4096) -> Path:
    """A random tiny Llama with the tiny tokenizer, for the services and the cluster."""
    config = tiny_config(max_position_embeddings=context, tie_word_embeddings=True)
    return write_hf_dir(directory, random_model(config, seed=seed))


# ---- GGUF ---------------------------------------------------------------------------------

GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf: str) -> str:
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    _, _, layer, rest = hf.split(".", 3)  # model.layers.N.rest
    return f"blk.{layer}.{GGUF_NAMES[rest]}"


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Llama's Q/K rows (written independently of ours)."""
    rows = weight.shape[0]
    return (weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_gguf(path: Path, model: Transformer, qtypes: dict[str, gguf.GGMLQuantizationType],
               pre: str = "smollm", chat_template: str | None = CHATML) -> Path:
    """``model`` as a GGUF file; ``qtypes`` maps a GGUF tensor-name suffix (``attn_q.weight``)
    to its type (default F32). Llama's Q/K rows are permuted as llama.cpp's converter does."""
    config = model.config
    arch = config.model_type
    writer = gguf.GGUFWriter(path, arch)
    _write_model_metadata(writer, config)
    _write_tokenizer_metadata(writer, pre, chat_template)
    heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}
    for name, tensor in to_hf_state(model.state_dict(), config).items():
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue
        target = gguf_name(name)
        values = tensor.detach().float().numpy()
        kind = target.split(".")[-2]
        if arch == "llama" and kind in heads:
            values = llama_cpp_permute(values, heads[kind])
        _add_tensor(writer, target, values, qtypes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_model_metadata(writer: gguf.GGUFWriter, config: ModelConfig) -> None:
    writer.add_name("tiny-test")
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope.theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_vocab_size(config.vocab_size)


def _write_tokenizer_metadata(writer: gguf.GGUFWriter, pre: str, chat_template: str | None
                              ) -> None:
    tokens = tiny_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL_TOKENS else 1 for t in tokens])
    writer.add_token_merges([" ".join(m) for m in MERGES])
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(chat_template)


# Offsets of each K-quant block's float16 scales (the rest of a block is free-form bits).
K_QUANT_SCALES = {
    gguf.GGMLQuantizationType.Q2_K: (80, 82),
    gguf.GGMLQuantizationType.Q3_K: (108,),
    gguf.GGMLQuantizationType.Q4_K: (0, 2),
    gguf.GGMLQuantizationType.Q5_K: (0, 2),
    gguf.GGMLQuantizationType.Q6_K: (208,),
}


def _add_tensor(writer: gguf.GGUFWriter, name: str, values: np.ndarray,
                qtypes: dict[str, gguf.GGMLQuantizationType]) -> None:
    suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
    qtype = qtypes.get(suffix, gguf.GGMLQuantizationType.F32)
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, values.astype(np.float32))
    elif qtype in K_QUANT_SCALES:
        writer.add_tensor(name, random_k_quant(values.shape, qtype, seed=len(name)),
                          raw_dtype=qtype)
    else:
        writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)


def random_k_quant(shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType, seed: int
                   ) -> np.ndarray:
    """Random K-quant blocks (gguf cannot quantize to these) with small, finite scales."""
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows, cols // block_values, block_bytes), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    for offset in K_QUANT_SCALES[qtype]:
        blocks[:, :, offset : offset + 2] = scale
    return blocks.reshape(rows, -1)
