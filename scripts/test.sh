#!/usr/bin/env bash
# Set up, lint, check generated code, run the whole test suite (slow tier included).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# the named models the tests read besides the default (setup installs the default alone)
.venv/bin/snapstream models pull gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b
.venv/bin/ruff check .
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
