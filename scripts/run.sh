#!/usr/bin/env bash
# Set up, start the local cluster (Redis, router, 1 prefill, 2 decode workers on the embedded
# model), stream a sample long-context request through the SDK, and stop everything.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/snapstream up --demo --exit-after-demo "$@"
