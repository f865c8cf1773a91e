#!/usr/bin/env bash
# Builds the images of the compose cluster from Debian's packages and PyPI alone, for machines
# that reach no container registry (air-gapped sites, CI):
#
#   snapstream-debian:bookworm   Debian bookworm minbase, made by mmdebstrap, `docker import`ed
#   python:$STOCK_TAG            Debian's Python 3.11        (stands in for python:3.11-slim-bookworm)
#   redis:$STOCK_TAG             Debian's redis-server 7.0   (stands in for redis:7.4-alpine)
#   nats:$STOCK_TAG              Debian's nats-server 2.9    (stands in for nats:2.10-alpine)
#   $IMAGE                       deploy/Dockerfile on $PYTHON_IMAGE (default python:$STOCK_TAG)
#
# Usage: deploy/images/build.sh [all|stock|app]      (default all; app: only $IMAGE)
#
# Rebuilds are incremental: the Debian base is made again only when its recipe changes (a
# label holds the recipe's hash); everything else is a `docker build` that reuses its layers.
#
# Environment:
#   STOCK_TAG=snapstream-local   tag of the local python, redis and nats images
#   IMAGE=snapstream:0.1.0       the snapstream image
#   MODEL=smollm2-135m           the named model the snapstream image holds besides the default
#   PYTHON_IMAGE                 base of the snapstream image (default python:$STOCK_TAG)
#   DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR   (default deb.debian.org's)
#   PIP_CA_BUNDLE                CA bundle pip trusts in the build (default: this machine's pip
#                                `cert` setting, if any)
#   TORCH_WHEEL                  a CPU torch wheel to install (default: the one in pip's
#                                find-links folders, if any; else PyTorch's CPU index)
# The CA bundle and the wheel reach the build stage only (deploy/build-extras/, ignored by git);
# the runtime image holds nothing of this machine.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
IMAGES_DIR="$REPO/deploy/images"
EXTRAS="$REPO/deploy/build-extras"
STOCK_TAG="${STOCK_TAG:-snapstream-local}"
IMAGE="${IMAGE:-snapstream:0.1.0}"
PYTHON_IMAGE="${PYTHON_IMAGE:-python:$STOCK_TAG}"
DEBIAN_IMAGE="snapstream-debian:bookworm"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
LOG_DIR="${TMPDIR:-/tmp}/snapstream-images"
export DOCKER_BUILDKIT=0  # the classic builder: no buildx plugin, no frontend image to pull

say() { printf 'build.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# step NAME NEEDS COMMAND...: runs COMMAND with its output in LOG_DIR/NAME.log; on failure one
# line says which step failed and what it needed.
step() {
    local name="$1" needs="$2" log="$LOG_DIR/$1.log" start=$SECONDS
    shift 2
    mkdir -p "$LOG_DIR"
    say "$name ..."
    if ! "$@" > "$log" 2>&1; then
        die "step '$name' failed; it needs $needs (last line: $(tail -n 1 "$log")); log: $log"
    fi
    say "$name done in $((SECONDS - start)) s"
}

need_docker() {
    command -v docker > /dev/null || die "docker is not installed (Debian: apt-get install docker.io)"
    docker info > /dev/null 2>&1 || die "the Docker daemon does not answer (start it: dockerd &)"
}

# ---- the Debian base: mmdebstrap's minbase, made again only when this recipe changes ----
debian_rootfs() {
    mmdebstrap --variant=minbase --mode=root \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --aptopt='APT::Install-Recommends "false"' \
        bookworm - \
        "deb $DEBIAN_MIRROR bookworm main" \
        "deb $DEBIAN_MIRROR bookworm-updates main" \
        "deb $DEBIAN_SECURITY_MIRROR bookworm-security main"
}

import_debian() {
    local recipe="$1"
    debian_rootfs | docker import --change "LABEL org.snapstream.recipe=$recipe" \
        --change 'CMD ["bash"]' - "$DEBIAN_IMAGE"
}

build_debian() {
    local recipe have
    recipe="$(declare -f debian_rootfs | sed "s|\$DEBIAN_MIRROR|$DEBIAN_MIRROR|g;
        s|\$DEBIAN_SECURITY_MIRROR|$DEBIAN_SECURITY_MIRROR|g" | sha256sum | cut -c1-16)"
    have="$(docker image inspect --format '{{ index .Config.Labels "org.snapstream.recipe" }}' \
        "$DEBIAN_IMAGE" 2> /dev/null || true)"
    if [[ "$have" == "$recipe" ]]; then
        say "$DEBIAN_IMAGE is current"
        return
    fi
    if ! command -v mmdebstrap > /dev/null; then
        if [[ $EUID -eq 0 ]] && command -v apt-get > /dev/null; then
            step install-mmdebstrap "Debian's package mirror (apt-get install mmdebstrap)" \
                apt-get install -y --no-install-recommends mmdebstrap
        else
            die "mmdebstrap is missing (Debian: apt-get install mmdebstrap)"
        fi
    fi
    step debian-base "Debian's package mirror $DEBIAN_MIRROR (mmdebstrap)" import_debian "$recipe"
}

stock_image() {  # stock_image NAME: deploy/images/NAME.Dockerfile -> NAME:$STOCK_TAG
    step "$1-image" "Debian's package mirror $DEBIAN_MIRROR (apt-get install in $1.Dockerfile)" \
        docker build --force-rm --build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE" -t "$1:$STOCK_TAG" \
        -f "$IMAGES_DIR/$1.Dockerfile" "$IMAGES_DIR"
}

# ---- what pip in the build stage gets from this machine: its CA bundle, a CPU torch wheel ----
pip_setting() {  # the host pip's setting $1 (e.g. global.cert), or nothing
    local pip
    for pip in pip3 pip; do
        if command -v "$pip" > /dev/null; then
            "$pip" config get "$1" 2> /dev/null && return
        fi
    done
    true
}

torch_version() {
    sed -n 's/.*"torch==\([^"]*\)".*/\1/p' "$REPO/pyproject.toml" | head -n 1
}

find_torch_wheel() {
    local version dir
    version="$(torch_version)"
    [[ -n "$version" ]] || die "pyproject.toml pins no torch==VERSION"
    for dir in ${PIP_FIND_LINKS:-} $(pip_setting global.find-links); do
        [[ -d "$dir" ]] || continue
        compgen -G "$dir/torch-$version+cpu-cp311-cp311-*linux*x86_64.whl" | head -n 1 && return
    done
    true
}

sync_file() {  # sync_file SRC DEST: copy unless identical (keeps the layer cache warm)
    cmp -s "$1" "$2" 2> /dev/null || cp "$1" "$2"
}

fill_extras() {  # deploy/build-extras/: pip.conf + the CA bundle, wheels/ + the torch wheel
    local ca wheel keep=(README.md wheels)
    ca="${PIP_CA_BUNDLE:-${PIP_CERT:-$(pip_setting global.cert)}}"
    wheel="${TORCH_WHEEL:-$(find_torch_wheel)}"
    [[ -z "$ca" || -f "$ca" ]] || die "PIP_CA_BUNDLE=$ca is not a file"
    [[ -z "$wheel" || -f "$wheel" ]] || die "TORCH_WHEEL=$wheel is not a file"
    if [[ -n "$ca" ]]; then keep+=(ca-certificates.crt pip.conf); fi
    if [[ -n "$wheel" ]]; then keep+=("$(basename "$wheel")"); fi
    mkdir -p "$EXTRAS/wheels"
    local path
    for path in "$EXTRAS"/* "$EXTRAS"/wheels/*; do
        if [[ -f "$path" && " ${keep[*]} " != *" $(basename "$path") "* ]]; then rm "$path"; fi
    done
    if [[ -n "$ca" ]]; then
        sync_file "$ca" "$EXTRAS/ca-certificates.crt"
        printf '[global]\ncert = /tmp/build-extras/ca-certificates.crt\n' > "$EXTRAS/pip.conf.new"
        sync_file "$EXTRAS/pip.conf.new" "$EXTRAS/pip.conf" && rm "$EXTRAS/pip.conf.new"
        say "pip in the build trusts $ca"
    fi
    if [[ -n "$wheel" ]]; then
        sync_file "$wheel" "$EXTRAS/wheels/$(basename "$wheel")"
        say "torch from $wheel"
    else
        say "torch from PyTorch's CPU index (no local CPU wheel found)"
    fi
}

build_app() {
    fill_extras
    local needs="Debian's package mirror (g++), PyPI (the dependencies)" args=()
    if compgen -G "$EXTRAS/wheels/torch-*.whl" > /dev/null; then
        args+=(--build-arg "TORCH_INDEX_URL=https://pypi.org/simple")  # torch's dependencies
    else
        needs="$needs and PyTorch's CPU index (torch)"
    fi
    step snapstream-image "$needs" docker build --force-rm -f "$REPO/deploy/Dockerfile" \
        --build-arg "PYTHON_IMAGE=$PYTHON_IMAGE" --build-arg "MODEL=${MODEL:-smollm2-135m}" \
        "${args[@]}" -t "$IMAGE" "$REPO"
}

main() {
    local what="${1:-all}"
    need_docker
    case "$what" in
        all) build_debian; stock_image python; stock_image redis; stock_image nats; build_app ;;
        stock) build_debian; stock_image python; stock_image redis; stock_image nats ;;
        app) build_app ;;
        *) die "usage: deploy/images/build.sh [all|stock|app]" ;;
    esac
    docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' \
        | grep -E "^(snapstream-debian:bookworm|(python|redis|nats):$STOCK_TAG|$IMAGE) " >&2 || true
}

main "$@"
