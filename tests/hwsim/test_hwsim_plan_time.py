"""Memory planner, step time and simulated clock."""

import json
from dataclasses import replace

import pytest
from hwsim_tiny_models import TINY_LLAMA

from hwsim import DoesNotFitError, PolicyConfig, PolicyKind, SimClock, SimTarget
from hwsim.config_loader import parse_config
from hwsim.hardware import SN40L, SystemSpec, Tier
from hwsim.timing import kernel_calls, step_time

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
        tier_reads={Tier.HBM: 1e6, Tier.DDR: 1e4}, flops=5e8, tokens=2, model=model,
        system=SystemSpec(socket, 4), kernel_looping=False, activation_bytes=2,
    )
    assert time.tier_s == {Tier.HBM: 2e-3, Tier.DDR: 2e-4}  # bytes / (bandwidth x 0.5)
    assert time.memory_s == 2e-3  # tiers stream concurrently
    assert time.compute_s == 1e-3  # 5e8 / (1e12 x 0.5)
    assert time.sync_s == 3e-3  # 2 layer calls + 1 head call
    # 5 all-reduces of 2 tokens x 8 x 2 bytes: 1 us + 2*3/4 * 32 B / 1 GB/s each
    assert time.collective_s == pytest.approx(5 * (1e-6 + 1.5 * 32 / 1e9))
    assert time.total_s == pytest.approx(2e-3 + 3e-3 + time.collective_s)


def test_kernel_looping_calls_per_layer_group():
    deepseek = SimTarget.load("deepseek-v3").model
    assert kernel_calls(deepseek, kernel_looping=True) == 3  # dense loop, MoE loop, head
    assert kernel_calls(deepseek, kernel_looping=False) == 62


def test_kernel_looping_speeds_up_decode():
    looped = SimTarget.load("llama-3.1-8b", sockets=16).decode_step(1, 4096)
    unlooped = SimTarget.load("llama-3.1-8b", sockets=16, kernel_looping=False).decode_step(
        1, 4096
    )
    assert unlooped.step_time_s - looped.step_time_s == pytest.approx(31 * 20e-6)


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
