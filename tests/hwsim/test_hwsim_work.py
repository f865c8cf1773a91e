"""Bytes and FLOPs per step, by hand for tiny models and against the kernel-looping table."""

import pytest
from hwsim_tiny_models import TINY_DEEPSEEK, TINY_GEMMA3, TINY_LLAMA

from hwsim.config_loader import load_model_spec, parse_config
from hwsim.dtypes import DType
from hwsim.hardware import GIB, SN40L, KvSharding, SystemSpec
from hwsim.policy import PolicyConfig, PolicyKind
from hwsim.sharding import per_socket
from hwsim.work import ComponentKind, Kernel, Precision, decode_work, prefill_work

BF16 = Precision()


def _by_name(work):
    return {c.name: c for c in work.components}


def test_tiny_llama_decode_by_hand():
    model = parse_config("tiny", TINY_LLAMA)
    work = decode_work(model, batch=2, cache_tokens=10, precision=BF16)
    parts = _by_name(work)
    # both layers, bf16: 2 x 592 params, of which the 2 x 2 norms of 8 are replicated
    assert parts["weights/layers"].read_bytes == (1184 - 32) * 2
    assert parts["weights/replicated"].read_bytes == 32 * 2
    assert parts["weights/embedding"].read_bytes == 2 * 8 * 2  # two gathered rows
    assert parts["weights/head"].read_bytes == 264 * 2
    # KV: 2 sequences x 10 tokens x 16 elements x 2 bytes; the new token writes 2 x 16 x 2
    assert parts["kv_cache"].read_bytes == 640
    assert parts["kv_cache"].write_bytes == 64
    assert work.bytes_moved == 2368 + 32 + 528 + 640 + 64  # one copy of everything
    assert work.replicated_flops == 0  # GQA splits every matmul by head
    # per token: 2 layers x (2*192 + 2*384) projections + 2 layers x 4*2*4*10 attention
    # + 2*32*8 LM head = 2304 + 640 + 512; two sequences
    assert work.flops == 2 * (2304 + 640 + 512)


def test_tiny_llama_prefill_by_hand():
    model = parse_config("tiny", TINY_LLAMA)
    work = prefill_work(model, batch=1, prompt_len=3, precision=BF16)
    # 3 tokens x 2304; 3*4/2 = 6 causal pairs x 2 layers x 32; LM head for the last token
    assert work.flops == 3 * 2304 + 6 * 2 * 32 + 512
    assert _by_name(work)["kv_cache"].write_bytes == 3 * 16 * 2
    assert _by_name(work)["weights/embedding"].read_bytes == 3 * 8 * 2


def test_tiny_gemma3_decode_reads_at_most_the_window_on_sliding_layers():
    model = parse_config("tiny-gemma", TINY_GEMMA3)
    work = decode_work(model, batch=2, cache_tokens=10, precision=BF16)
    # 2 sequences x (4 windowed layers x 4 tokens + 1 global x 10) x 8 elements x 2 bytes
    assert _by_name(work)["kv_cache"].read_bytes == 2 * 26 * 8 * 2
    # attention 4*2*4 FLOPs per (query head group, key): over 26 layer-tokens, not 50
    every_global = {**TINY_GEMMA3, "layer_types": ["full_attention"] * 5}
    plain = decode_work(parse_config("tiny", every_global), batch=2, cache_tokens=10,
                        precision=BF16)
    assert plain.flops - work.flops == 2 * 32 * (50 - 26)


def test_tiny_deepseek_decode_by_hand():
    model = parse_config("tiny-ds", TINY_DEEPSEEK)
    work = decode_work(model, batch=1, cache_tokens=5, precision=Precision(weights=DType.FP8))
    parts = _by_name(work)
    # 1 token touches 2 of 4 routed experts (96 params each) in each of 2 MoE layers, fp8
    assert parts["weights/routed_experts"].resident_bytes == 2 * 384
    assert parts["weights/routed_experts"].read_bytes == 2 * 2 * 96
    assert parts["weights/routed_experts"].kernel is Kernel.EXPERTS
    # replicated per layer: q_a 4*(8+1) + kv_a 8*(4+2)+4 = 88, norms 16, MoE router 4*8 = 32;
    # dense layer 88 + 16 = 104, MoE layer 88 + 32 + 16 = 136
    assert parts["weights/replicated"].read_bytes == 104 + 2 * 136
    assert parts["weights/layers"].read_bytes == (584 - 104) + 2 * (712 - 384 - 136)
    # latent 4 + rope 2 per layer, 3 layers, 5 tokens, bf16 cache
    assert parts["kv_cache"].read_bytes == 5 * 18 * 2
    # attention (absorbed): per cached token per layer 2*2*(4+2) + 2*2*4 = 40
    # projections: 3 x 2*184 attention, dense 2*384, MoE 2*((2+1)*96 + 32) = 640 per layer
    assert work.flops == 3 * 2 * 184 + 2 * 384 + 2 * 640 + 3 * 40 * 5 + 2 * 16 * 8
    # replicated matmuls: 3 layers x 2*88 down-projections + 2 MoE layers x 2*32 router
    assert work.replicated_flops == 3 * 2 * 88 + 2 * 2 * 32


def test_llama_8b_kernel_looping_table():
    """arXiv 2410.23668 Table 1: Llama-3.1-8B BF16, batch 1, context 4096 (GiB units)."""
    model = load_model_spec("llama-3.1-8b")
    work = decode_work(model, batch=1, cache_tokens=4096, precision=BF16)
    assert work.resident_bytes(ComponentKind.WEIGHTS) == 2 * 8_030_261_248  # 14.96 GiB
    assert work.resident_bytes(ComponentKind.KV_CACHE) == GIB // 2  # 32 x 8 x 128 x 2 x 2 x 4096
    # every weight but the embedding table (one row gathered) is read: 14.48 GiB
    assert work.bytes_moved / GIB == pytest.approx(14.48, abs=0.01)
    # 2 x 7.50e9 matmul params + 4 x 32 heads x 128 x 4096 x 32 layers attention
    assert work.flops == pytest.approx(17.157e9, rel=1e-4)


def test_policy_cache_tokens():
    snap = PolicyConfig(PolicyKind.SNAPSTREAM, n_sink=4, n_topk=60, n_recent=64)
    assert snap.cache_tokens(10) == snap.cache_tokens(100_000) == 128  # static shape
    assert PolicyConfig(PolicyKind.FULL).cache_tokens(4096) == 4096
    with pytest.raises(ValueError, match="n_recent must be >= 1"):
        PolicyConfig(n_recent=0)
    with pytest.raises(ValueError, match="n_sink must be an integer >= 0"):
        PolicyConfig(n_sink=-1)
    with pytest.raises(ValueError, match="context must be an integer >= 1"):
        snap.cache_tokens(0)


def test_snapstream_is_four_times_smaller_at_128k():
    model = load_model_spec("deepseek-v3")
    full = decode_work(model, 1, PolicyConfig(PolicyKind.FULL).cache_tokens(131072), BF16)
    snap = decode_work(model, 1, PolicyConfig().cache_tokens(131072), BF16)
    ratio = full.resident_bytes(ComponentKind.KV_CACHE) / snap.resident_bytes(
        ComponentKind.KV_CACHE
    )
    assert ratio == 4.0
    # 131072 tokens x 61 layers x 576 elements x 2 bytes = 9.21 GB per sequence
    assert full.resident_bytes(ComponentKind.KV_CACHE) == 131072 * 61 * 576 * 2


@pytest.mark.parametrize(
    ("sharding", "sockets", "kv_share"),
    [
        (KvSharding.HEADS, 4, 1.0),  # one KV head: every socket keeps the whole cache
        (KvSharding.SEQUENCE, 4, 0.25),
        (KvSharding.HEADS, 1, 1.0),
    ],
)
def test_per_socket_share(sharding, sockets, kv_share):
    model = parse_config("tiny", TINY_LLAMA)
    work = decode_work(model, batch=2, cache_tokens=10, precision=BF16)
    socket = per_socket(work, model, SystemSpec(SN40L, sockets, sharding))
    parts = _by_name(socket)
    assert parts["kv_cache"].read_bytes == 640 * kv_share
    assert parts["weights/layers"].read_bytes == 2304 / sockets
    assert parts["weights/replicated"].read_bytes == 64  # the norms, whole on every socket
    assert socket.flops == work.flops / sockets


def test_replicated_weights_and_flops_per_socket():
    model = parse_config("tiny-ds", TINY_DEEPSEEK)
    work = decode_work(model, batch=2, cache_tokens=5, precision=Precision(weights=DType.FP8))
    socket = per_socket(work, model, SystemSpec(SN40L, 4, KvSharding.SEQUENCE))
    parts = _by_name(socket)
    assert parts["weights/replicated"].resident_bytes == 104 + 2 * 136  # whole, see above
    assert parts["weights/layers"].resident_bytes == (480 + 2 * 192) / 4
    # 2 tokens x (3*2*88 + 2*2*32) = 1312 replicated FLOPs on every socket, the rest / 4
    assert work.replicated_flops == 1312
    assert socket.flops == (work.flops - 1312) / 4 + 1312


def test_gqa_heads_replicate_beyond_kv_head_count():
    model = load_model_spec("llama-3.1-8b")  # 8 KV heads
    work = decode_work(model, batch=1, cache_tokens=4096, precision=BF16)
    kv = work.resident_bytes(ComponentKind.KV_CACHE)
    on_8 = per_socket(work, model, SystemSpec(SN40L, 8)).resident_bytes(ComponentKind.KV_CACHE)
    on_16 = per_socket(work, model, SystemSpec(SN40L, 16)).resident_bytes(ComponentKind.KV_CACHE)
    assert on_8 == on_16 == kv / 8  # 16 sockets hold each of the 8 heads twice
