"""Command-line tools the deploy tests run, installed by the dev extra into the virtualenv."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest


def dev_tool(name: str, package: str) -> str:
    """The path of ``name`` (the virtualenv's first); fails the test naming the pip package."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (pip install {package}: the dev extra)",
                    pytrace=False)
    return found
