"""Memory planner, step time and simulated clock."""

import json
from dataclasses import replace

import pytest
from hwsim_tiny_models import TINY_DEEPSEEK, TINY_LLAMA

from hwsim import DoesNotFitError, PolicyConfig, PolicyKind, SimClock, SimTarget
from hwsim.config_loader import parse_config
from hwsim.hardware import SN40L, SystemSpec, Tier
from hwsim.timing import kernel_calls, step_time
from hwsim.work import Kernel

FULL = PolicyConfig(PolicyKind.FULL)


def _tiny_target(tmp_path, **overrides):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    return SimTarget.load(str(tmp_path), sockets=1, policy=FULL, hardware_overrides=overrides)


def test_plan_places_weights_and_kv_in_hbm_and_store_in_ddr(tmp_path):
    _work, _socket, plan = _tiny_target(tmp_path).plan(batch=2, context_len=10)
    assert plan.fits
    # weights 1184 + 256 + 264 params in bf16, KV 640 bytes
    assert plan.used_bytes(Tier.HBM) == 3408 + 640
    assert plan.used_bytes(Tier.DDR) == 3408  # model store copy
    # SRAM: 2 buffers x 2 tokens x (8 + widest 32) x 2 bytes + fp32 logits 2 x 32 x 4
    assert plan.used_bytes(Tier.SRAM) == 320 + 256


def test_hbm_shortfall_names_tier_and_bytes(tmp_path):
    target = _tiny_target(tmp_path, hbm_bytes=4000)
    plan = target.plan(batch=2, context_len=10)[2]
    assert plan.shortfall.tier is Tier.HBM
    assert plan.shortfall.missing_bytes == 48
    with pytest.raises(DoesNotFitError, match=r"HBM short by 0\.00 GiB per socket") as info:
        target.decode_step(batch=2, context_len=10)
    assert "--policy snapstream" in str(info.value)


def test_ddr_spill_moves_least_read_bytes(tmp_path):
    target = replace(_tiny_target(tmp_path, hbm_bytes=4000), ddr_spill=True)
    cost = target.decode_step(batch=2, context_len=10)
    # the embedding (32 of 512 bytes read per step) is spilled first: 48 bytes go to DDR,
    # where a step reads 48 * 32/512 = 3 of them from the weight store
    assert cost.plan.used_bytes(Tier.HBM) == 4000
    assert cost.plan.read_bytes(Tier.DDR) == 3
    assert cost.plan.used_bytes(Tier.DDR) == 3408


def test_sram_shortfall():
    target = SimTarget.load("llama-3.1-8b", sockets=1, policy=FULL,
                            hardware_overrides={"sram_bytes": 1000})
    with pytest.raises(DoesNotFitError, match=r"SRAM short by .*reduce --batch"):
        target.decode_step(batch=1, context_len=16)


def test_step_time_by_hand():
    model = parse_config("tiny", TINY_LLAMA)
    socket = replace(
        SN40L, hbm_bandwidth=1e9, ddr_bandwidth=1e8, memory_efficiency=0.5, peak_flops=1e12,
        compute_efficiency=0.5, kernel_call_s=1e-3, collective_latency_s=1e-6, p2p_bandwidth=1e9,
    )
    time = step_time(
        reads={Kernel.DECODER: {Tier.HBM: 1e6, Tier.DDR: 1e4}}, flops=5e8, tokens=2,
        model=model, system=SystemSpec(socket, 4), kernel_looping=False, activation_bytes=2,
    )
    assert time.tier_s == {Tier.HBM: 2e-3, Tier.DDR: 2e-4}  # bytes / (bandwidth x 0.5)
    assert time.memory_s == 2e-3  # tiers stream concurrently
    assert time.compute_s == 1e-3  # 5e8 / (1e12 x 0.5)
    assert time.kernel_calls == 3  # 2 layer calls + 1 head call
    assert time.sync_s == 3e-3
    # 5 all-reduces of 2 tokens x 8 x 2 bytes: 1 us + 2*3/4 * 32 B / 1 GB/s each
    assert time.collective_s == pytest.approx(5 * (1e-6 + 1.5 * 32 / 1e9))
    assert time.total_s == pytest.approx(2e-3 + 3e-3 + time.collective_s)


def test_expert_kernel_adds_to_decoder_kernel():
    socket = replace(SN40L, hbm_bandwidth=1e9, ddr_bandwidth=1e8, memory_efficiency=0.5)
    time = step_time(
        reads={Kernel.DECODER: {Tier.HBM: 1e6, Tier.DDR: 0.0},
               Kernel.EXPERTS: {Tier.HBM: 4e5, Tier.DDR: 1e5}},
        flops=0.0, tokens=1, model=parse_config("tiny", TINY_LLAMA),
        system=SystemSpec(socket, 1), kernel_looping=True, activation_bytes=2,
    )
    # decoder 1e6 / 5e8 = 2 ms; experts max(4e5 / 5e8, 1e5 / 5e7) = max(0.8, 2) ms
    assert time.memory_s == pytest.approx(2e-3 + 2e-3)
    assert time.tier_s == {Tier.HBM: pytest.approx(2.8e-3), Tier.DDR: pytest.approx(2e-3)}


def test_moe_kernel_calls_by_hand():
    tiny = parse_config("tiny-ds", TINY_DEEPSEEK)  # 1 dense layer, 2 MoE layers: top-2 of 4
    # looped: the dense group, 2 MoE layers x (decoder + looped experts), the head
    assert kernel_calls(tiny, kernel_looping=True, tokens=1) == 1 + 2 * 2 + 1
    # unlooped, 1 token: 1 dense call, 2 x (decoder + 2 experts), the head
    assert kernel_calls(tiny, kernel_looping=False, tokens=1) == 1 + 2 * 3 + 1
    # 2 tokens touch 4 * (1 - (1/2)^2) = 3 experts per layer
    assert kernel_calls(tiny, kernel_looping=False, tokens=2) == 1 + 2 * 4 + 1
    assert kernel_calls(tiny, kernel_looping=True, tokens=2) == 6  # looping hides the count


def test_kernel_looping_calls_per_layer_group():
    deepseek = SimTarget.load("deepseek-v3").model
    # dense loop (3 layers), 58 MoE layers x (decoder + looped experts), head
    assert kernel_calls(deepseek, kernel_looping=True) == 1 + 58 * 2 + 1
    # 3 dense calls, 58 x (decoder + 8 experts), head
    assert kernel_calls(deepseek, kernel_looping=False) == 3 + 58 * 9 + 1


def test_kernel_looping_speeds_up_decode():
    looped = SimTarget.load("llama-3.1-8b", sockets=16).decode_step(1, 4096)
    unlooped = SimTarget.load("llama-3.1-8b", sockets=16, kernel_looping=False).decode_step(
        1, 4096
    )
    assert unlooped.step_time_s - looped.step_time_s == pytest.approx(31 * 20e-6)


def test_ddr_spilled_experts_cannot_overlap_the_decoder_kernel(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_DEEPSEEK))
    overrides = {"hbm_bytes": 1940, "hbm_bandwidth": 1e9, "ddr_bandwidth": 1e8,
                 "memory_efficiency": 0.5}
    target = SimTarget.load(str(tmp_path), sockets=1, dtype="fp8", kv_dtype="bf16",
                            policy=FULL, ddr_spill=True, hardware_overrides=overrides)
    cost = target.decode_step(batch=1, context_len=5)
    # fp8 bytes read once each: split layers 864, replicated 376, head 136, KV 5*18*2 = 180
    # fill 1556 of HBM; routed experts (read 1/2 of 768) get the other 384, 384 spill to
    # DDR; the embedding (1 row of 16 read) spills whole.
    assert cost.plan.read_bytes(Tier.DDR, Kernel.EXPERTS) == 192
    assert cost.plan.read_bytes(Tier.DDR, Kernel.DECODER) == 8
    # decoder: HBM (1556 + 36 new KV) / 5e8; experts: max(HBM 192 / 5e8, DDR 192 / 5e7)
    assert cost.time.memory_s == pytest.approx(1592 / 5e8 + 192 / 5e7)
    assert cost.time.tier_s[Tier.DDR] == pytest.approx(200 / 5e7)


def test_deepseek_r1_batch_1_calibration():
    """FP8 DeepSeek-R1, 16 sockets, batch 1, 4k context against the published 198 tokens/s."""
    target = SimTarget.load("deepseek-r1", sockets=16, dtype="fp8", kv_dtype="bf16",
                            policy=FULL)
    cost = target.decode_step(batch=1, context_len=4096)
    assert cost.time.kernel_calls == 118
    assert cost.time.sync_s == pytest.approx(118 * 20e-6)
    # each socket reads all 61 x 15,140,864 down-projection and 58 x 1,835,008 router bytes
    replicated = cost.socket_work.components[1]
    assert replicated.name == "weights/replicated"
    assert replicated.read_bytes == 61 * (15_140_864 + 2 * 7168) + 58 * 1_835_008
    assert 0.8 * 198 < cost.tokens_per_s_per_user < 1.2 * 198


def test_step_cost_throughput():
    cost = SimTarget.load("deepseek-v3", dtype="fp8", kv_dtype="bf16").decode_step(8, 131072)
    assert cost.tokens_per_s == pytest.approx(8 * cost.tokens_per_s_per_user)
    assert cost.cache_tokens == 32768
    assert cost.step_time_s == cost.time.total_s


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sockets": 0}, "sockets must be >= 1"),
        ({"dtype": "int4"}, "dtype: unknown 'int4'"),
        ({"kv_sharding": "rows"}, "kv_sharding: unknown 'rows'"),
        ({"hardware": "tpu"}, "hardware: unknown 'tpu'"),
        ({"hardware_overrides": {"hbm_bandwidth": -1.0}}, "hbm_bandwidth must be > 0"),
        ({"hardware_overrides": {"memory_efficiency": 1.5}}, "memory_efficiency must be in"),
        ({"hardware_overrides": {"warp_size": 32}}, "unknown field.*warp_size"),
    ],
)
def test_invalid_target(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimTarget.load("llama-3.1-8b", **kwargs)


def test_invalid_step_inputs():
    target = SimTarget.load("llama-3.1-8b")
    with pytest.raises(ValueError, match="batch must be an integer >= 1"):
        target.decode_step(0, 128)
    with pytest.raises(ValueError, match="context must be an integer >= 1"):
        target.decode_step(1, -5)
    with pytest.raises(ValueError, match="prompt_len must be an integer >= 1"):
        target.prefill(1, 0)


def test_sim_clock_accumulates_simulated_time():
    cost = SimTarget.load("llama-3.1-8b", sockets=8).decode_step(4, 4096)
    clock = SimClock()
    assert clock.tokens_per_s == 0.0
    clock.advance(cost)
    clock.advance(cost, tokens=2)  # two slots idle
    assert clock.steps == 2
    assert clock.tokens == 6
    assert clock.elapsed_s == pytest.approx(2 * cost.step_time_s)
    assert clock.tokens_per_s == pytest.approx(6 / (2 * cost.step_time_s))
    assert clock.mean_step_s == pytest.approx(cost.step_time_s)
    with pytest.raises(ValueError, match=r"tokens must be in \[0, 4\]"):
        clock.advance(cost, tokens=5)
