#!/usr/bin/env bash
# Set up, lint, check generated code, run the whole test suite (slow tier included).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
