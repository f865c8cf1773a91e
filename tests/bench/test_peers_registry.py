"""Peer venv cache keys and lookup, the system registry and its options (no venv is built)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.peers import recipes
from bench.peers.batch import PeersBatchConfig
from bench.peers.bench import PeersBenchConfig
from bench.peers.passkey import PeersPasskeyConfig
from bench.peers.peer_model import peer_model
from bench.peers.runners import RUNNERS
from bench.peers.systems import (
    SYSTEMS,
    PeerBudget,
    PeerSystem,
    compression_ratio,
    get_system,
    register,
)
from bench.peers.venvs import (
    COMPLETE_MARKER,
    Step,
    Venv,
    VenvSpec,
    ensure_venv,
    find_venv,
    peers_root,
)
from snapstream.checkpoints import open_checkpoint
from snapstream.cpu import capped_flags
from snapstream.policy import load_default_policy


def _spec(**changes) -> VenvSpec:
    fields = dict(name="toy", requirements=("numpy==2.4.6",),
                  steps=(Step("say", ("echo", "{venv}")),))
    return VenvSpec(**{**fields, **changes})


def test_venv_key_is_stable_and_follows_every_part_of_the_recipe():
    base = _spec()
    assert base.key == _spec().key and len(base.key) == 12
    assert base.dirname == f"toy-{base.key}"
    variants = [_spec(requirements=("numpy==2.4.5",)),
                _spec(requirements=("numpy==2.4.6", "gguf")),
                _spec(pip_env=(("CMAKE_ARGS", "-DX=ON"),)),
                _spec(steps=(Step("say", ("echo", "{python}")),)),
                _spec(steps=(Step("say", ("echo", "{venv}"), (("A", "1"),)),)),
                _spec(python_tag="3.12")]
    keys = {v.key for v in variants}
    assert len(keys) == len(variants) and base.key not in keys
    assert _spec(name="other").key == base.key  # the name is in the directory, not the key


@pytest.mark.parametrize("bad", [dict(name="Toy"), dict(name="a b"), dict(requirements=())])
def test_venv_spec_refuses_bad_fields(bad):
    with pytest.raises(ValueError):
        _spec(**bad)


def test_peer_venvs_live_in_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("SNAPSTREAM_PEERS_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert peers_root() == tmp_path / "snapstream" / "peers"
    monkeypatch.setenv("SNAPSTREAM_PEERS_HOME", str(tmp_path / "elsewhere"))
    assert peers_root() == tmp_path / "elsewhere"


def test_only_a_complete_venv_is_found_and_reused(tmp_path):
    spec = _spec()
    path = tmp_path / spec.dirname
    path.mkdir()
    assert find_venv(spec, tmp_path) is None  # half-built: no marker
    (path / COMPLETE_MARKER).write_text(json.dumps({"build_s": 1.5, "versions": ["a==1"]}))
    venv = ensure_venv(spec, echo=pytest.fail, root=tmp_path)  # nothing to build or say
    assert venv.path == path and venv.python == path / "bin" / "python"
    assert venv.info["versions"] == ["a==1"]
    assert find_venv(_spec(requirements=("numpy==2.4.5",)), tmp_path) is None


def test_llama_cpp_builds_only_the_avx512_extensions_the_cpu_has():
    """A build with an extension the CPU lacks dies of SIGILL on its first token; the options
    are in the recipe, so a venv built on another CPU has another key."""
    skylake = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw"})
    sapphire = skylake | {"avx512_vbmi", "avx512_vnni", "avx512_bf16", "amx_tile"}
    old = recipes.llama_cmake_args(skylake)
    new = recipes.llama_cmake_args(sapphire)
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF"} <= set(old)
    assert {"-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX512_VBMI=ON"} <= set(new)
    assert "-DGGML_AVX512=OFF" in recipes.llama_cmake_args(frozenset({"avx2"}))
    assert not any("AMX" in arg for arg in new)
    assert recipes.llama_cmake_args(capped_flags()) == recipes.LLAMA_CMAKE_ARGS


def test_a_capped_machine_builds_llama_cpp_as_a_cpu_of_that_kind():
    """SNAPSTREAM_KERNELS=avx2 on an AVX-512 machine forces llama.cpp's build down with ours."""
    sapphire = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                          "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16"})
    assert capped_flags(sapphire, "native") == sapphire
    assert capped_flags(sapphire, "avx512") == {"avx2", "fma", "f16c", "avx512f", "avx512bw",
                                                "avx512vl", "avx_vnni"}
    assert capped_flags(sapphire, "avx2") == {"avx2", "fma", "f16c", "avx_vnni"}
    avx2 = recipes.llama_cmake_args(capped_flags(sapphire, "avx2"))
    assert "-DGGML_AVX512=OFF" in avx2 and "-DGGML_AVX2=ON" in avx2


def test_recipes_pin_their_top_level_packages():
    assert recipes.LLAMACPP.requirements == ("llama-cpp-python[server]==0.3.36",)
    for spec in (recipes.OPENVINO, recipes.KVPRESS):
        assert "torch==2.13.0" in spec.requirements
    assert "kvpress==0.5.5" in recipes.KVPRESS.requirements
    assert len({recipes.LLAMACPP.key, recipes.OPENVINO.key, recipes.KVPRESS.key}) == 3


def test_registry_holds_the_peers_and_refuses_duplicates():
    assert set(PeersBenchConfig().systems) <= set(SYSTEMS)
    for system in SYSTEMS.values():
        assert (RUNNERS / system.runner).is_file()
    with pytest.raises(ValueError, match="already registered"):
        register(get_system("llama.cpp"))
    with pytest.raises(ValueError, match=r"unknown peer system 'vllm'; known: llama\.cpp"):
        get_system("vllm")
    with pytest.raises(ValueError, match="no runner"):
        PeerSystem(name="x", label="x", venv=None, runner="run_missing.py")


def test_system_options_follow_the_budget():
    budget = PeerBudget(total=1024, n_sink=4, n_recent=256, observation=32, kernel=15)
    eviction = get_system("openvino-evict").load_options(budget)["cache_eviction"]
    assert eviction["max_cache_size"] == 1024 and eviction["snapkv_window_size"] == 32
    assert eviction["start_size"] == 32 and eviction["recent_size"] == 256  # whole blocks
    # the model's policy keeps no sinks; OpenVINO refuses an empty start: one block
    no_sinks = PeerBudget(total=1024, n_sink=0, n_recent=256, observation=16, kernel=31)
    assert get_system("openvino-evict").load_options(no_sinks)["cache_eviction"][
        "start_size"] == 32
    assert get_system("openvino").load_options(budget) == {}
    press = get_system("kvpress-snapkv").generate_options(8000, budget)["press"]
    assert press["name"] == "SnapKVPress" and press["kwargs"]["window_size"] == 32
    assert press["kwargs"]["kernel_size"] == 15
    assert get_system("transformers").generate_options(8000, budget) == {}
    policy = get_system("snapstream").generate_options(8000, budget)["policy"]
    assert (policy["kind"], policy["n_sink"] + policy["n_topk"] + policy["n_recent"],
            policy["observation"], policy["kernel"]) == ("snapstream", 1024, 32, 15)
    assert get_system("snapstream-full").generate_options(8000, budget)["policy"]["kind"] == "full"
    assert get_system("snapstream").venv is None  # the project's own interpreter
    env = get_system("llama.cpp").runner_env(Venv(recipes.LLAMACPP, Path("/v")))
    assert env["LLAMA_CPP_LIB_PATH"] == "/v/llama.cpp/bin"


@pytest.mark.parametrize("num_tokens", [1025, 1500, 4096, 7777, 8000, 8192])
@pytest.mark.parametrize("keep", [256, 1000, 1024])
def test_compression_ratio_keeps_exactly_the_budget(num_tokens, keep):
    ratio = compression_ratio(num_tokens, keep)
    assert int(num_tokens * (1 - ratio)) == keep  # kvpress's own rounding
    assert compression_ratio(keep, keep) == 0.0


@pytest.mark.parametrize("bad", [dict(total=200, n_sink=4, n_recent=256), dict(observation=0),
                                 dict(kernel=4)])
def test_budget_refuses_bad_layouts(bad):
    with pytest.raises(ValueError):
        PeerBudget(**{**asdict(peer_model().budget), **bad})


@pytest.mark.parametrize("name", [None, "smollm2-135m", "gemma3-270m"])
def test_the_budget_is_the_models_policy(name):
    checkpoint = open_checkpoint(name)
    policy = load_default_policy(checkpoint.policy_file)
    for cfg in (PeersBenchConfig(model=name), PeersBatchConfig(model=name),
                PeersPasskeyConfig(model=name)):
        budget = cfg.budget
        assert (budget.total, budget.n_sink, budget.n_recent, budget.observation,
                budget.kernel) == (policy.budget, policy.n_sink, policy.n_recent,
                                   policy.observation, policy.kernel)


def test_the_model_choice_gives_its_file_context_windows_and_doc_section():
    smol, gemma = peer_model(), peer_model("gemma3-270m")
    assert peer_model("smollm2-135m") == smol and smol.name == "smollm2-135m"
    assert smol.gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and smol.context_len == 8192
    assert set(smol.attention_windows) == {None}
    assert gemma.gguf.name == "gemma-3-270m-q4_k_m.gguf" and gemma.context_len == 32768
    # 18 layers: 5 sliding-window layers of 512 per global one
    assert gemma.attention_windows == ((512,) * 5 + (None,)) * 3
    assert (smol.section(), smol.section("passkey")) == ("peers", "peers-passkey")
    assert (gemma.section(), gemma.section("passkey")) == ("peers-gemma3-270m",
                                                          "peers-gemma3-270m-passkey")
    assert peer_model(str(gemma.gguf)).section() == "peers-gemma-3-270m-q4_k_m"
    assert peer_model(str(gemma.gguf)).budget == gemma.budget


def test_n_ctx_is_the_longest_prompt_within_the_models_context():
    assert PeersBenchConfig(lengths=(2048, 8000), max_new_tokens=32).n_ctx == 8032
    cfg = PeersBenchConfig(model="gemma3-270m", lengths=(2048, 8192, 32000), max_new_tokens=32)
    assert cfg.n_ctx == 32032
    with pytest.raises(ValueError, match="exceed SmolLM2-135M-Instruct's context of 8192"):
        PeersBenchConfig(lengths=(2048, 32000))
    with pytest.raises(ValueError, match="exceed Gemma 3 270M's context of 32768"):
        PeersBenchConfig(model="gemma3-270m", lengths=(32768,))
    with pytest.raises(ValueError, match="context of 8192"):
        PeersBatchConfig(prompt_len=8192)
    assert PeersBatchConfig(model="gemma3-270m", prompt_len=8192).n_ctx == 8192 + 128 + 64


def test_an_unknown_model_names_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"llama-7b.*smollm2-135m, gemma3-270m"):
        peer_model("llama-7b")
    with pytest.raises(ValueError, match=r"smollm2-135m, gemma3-270m"):
        PeersBenchConfig(model="llama-7b")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="the peers read GGUF files"):
        peer_model(str(tmp_path))


@pytest.mark.parametrize("bad", [dict(max_new_tokens=1), dict(lengths=(8190,)),
                                 dict(systems=("nope",)), dict(rounds=0), dict(lengths=(100,))])
def test_bench_config_refuses_bad_settings(bad):
    with pytest.raises(ValueError):
        PeersBenchConfig(**bad)


def test_a_system_can_be_kept_to_shorter_prompts():
    cfg = PeersBenchConfig(model="gemma3-270m", lengths=(2048, 8192, 32000),
                           max_lengths=(("transformers", 8192),))
    assert cfg.runs("transformers", 8192) and not cfg.runs("transformers", 32000)
    assert cfg.runs("llama.cpp", 32000)
    with pytest.raises(ValueError, match="unknown peer system 'nope'"):
        PeersBenchConfig(max_lengths=(("nope", 4096),))
    with pytest.raises(ValueError, match="warm-up"):
        PeersBenchConfig(max_lengths=(("transformers", 100),))
