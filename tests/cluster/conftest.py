"""A tiny random checkpoint that every cluster in these tests serves."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_models import write_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"))
