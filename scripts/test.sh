#!/usr/bin/env bash
# Set up, lint, check generated code, run the whole test suite (slow tier included).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# the aarch64 cross compiler that checks the kernels build off x86-64 (tests/engine/
# test_portable_build.py); apt's output goes to build/setup.log with setup's
if ! command -v aarch64-linux-gnu-g++ >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if { $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q \
      g++-aarch64-linux-gnu; } >>build/setup.log 2>&1; then
    echo "test setup: aarch64 cross compiler installed"
  else
    echo "test setup: installing g++-aarch64-linux-gnu failed; the end of build/setup.log:" >&2
    tail -n 20 build/setup.log >&2
    exit 1
  fi
fi
# the named models the tests read besides the default (setup installs the default alone)
.venv/bin/snapstream models pull gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b
.venv/bin/ruff check .
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
