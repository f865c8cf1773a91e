#!/usr/bin/env bash
# The compose cluster on this host: Redis, NATS JetStream, the router, one prefill worker, two
# decode workers, each container healthy before `up` returns.
#
#   deploy/compose.sh up [--store redis|nats] [--secure] [--model NAME]
#   deploy/compose.sh down                  # containers, networks, volumes, the files up made
#   deploy/compose.sh compose ARGS...       # the compose command on the running cluster
#                                           # (e.g. `compose up -d --scale decode=3`)
#   deploy/compose.sh wait                  # until every container of it is healthy
#   deploy/compose.sh images                # Docker (installed, started) and the images only
#
# `up` installs docker.io and docker-compose and starts dockerd where they are missing (as root
# on Debian), builds whatever images are missing (the public python, redis and nats images
# where they can be pulled, else the local ones of deploy/images/build.sh; the snapstream image
# always, incrementally), starts the cluster and prints, on stdout, the router's addresses:
#
#   SNAPSTREAM_ADDR=127.0.0.1:50051
#   OPENAI_BASE_URL=http://127.0.0.1:8000/v1
#
# `--secure` adds deploy/docker-compose.secure.yml: TLS on every service (a CA and certificate
# made for this run) and an API key on the router; it then also prints SNAPSTREAM_TLS_CA and
# SNAPSTREAM_API_KEY_FILE. `--model NAME` (or MODEL): the named model the services serve
# (`snapstream models list`; default smollm2-135m), pulled into the image at its build, whose tag
# is then snapstream:0.1.0-NAME. Environment: ROUTER_PORT, HTTP_PORT, IMAGE, MODEL, STOCK_TAG,
# REDIS_PASSWORD, NATS_USER, NATS_PASSWORD (deploy/docker-compose.yml), UP_TIMEOUT_S (600).
# Compose: the v2 plugin (`docker compose`) when there is one, else docker-compose (1.29 or 2.x).
set -euo pipefail

DEPLOY="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="$DEPLOY/.compose"  # what `up` made: its settings, TLS files and API key
PROJECT="${COMPOSE_PROJECT_NAME:-snapstream}"
PUBLIC_STOCK=(python:3.11-slim-bookworm redis:7.4-alpine nats:2.10-alpine)
DEFAULT_MODEL=smollm2-135m

say() { printf 'compose.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# ---- Docker itself ----
can_install() { [[ $EUID -eq 0 ]] && command -v apt-get > /dev/null; }

apt_install() {
    say "installing $* (apt-get)"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" \
            > /dev/null 2>&1; then
        apt-get update > /dev/null 2>&1 || die "apt-get update failed: Debian's package mirror is needed to install $*"
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" > /dev/null \
            || die "apt-get install $* failed"
    fi
}

ensure_docker() {
    if ! command -v dockerd > /dev/null; then
        can_install || die "Docker is not installed: on Debian, as root: apt-get install docker.io docker-compose; elsewhere: https://docs.docker.com/engine/install/"
        apt_install docker.io docker-compose
    fi
    if ! docker info > /dev/null 2>&1; then
        [[ $EUID -eq 0 ]] || die "the Docker daemon is not running: start it (sudo systemctl start docker, or sudo dockerd &)"
        say "starting dockerd (log: /var/log/snapstream-dockerd.log)"
        setsid dockerd > /var/log/snapstream-dockerd.log 2>&1 < /dev/null &
        local waited=0
        until docker info > /dev/null 2>&1; do
            ((waited++ < 60)) || die "dockerd did not answer within 60 s (see /var/log/snapstream-dockerd.log)"
            sleep 1
        done
    fi
    if ! docker compose version > /dev/null 2>&1 && ! command -v docker-compose > /dev/null; then
        can_install || die "no Docker Compose: install the compose plugin or docker-compose"
        apt_install docker-compose
    fi
}

daemon_up() { command -v docker > /dev/null && docker info > /dev/null 2>&1; }

compose() (  # the compose command with this project's files and the settings `up` recorded
    # (a subshell: the recorded settings stay out of the caller's variables)
    local files=(-f "$DEPLOY/docker-compose.yml")
    if [[ -f "$STATE/settings.env" ]]; then
        set -a
        # shellcheck disable=SC1091
        source "$STATE/settings.env"
        set +a
    fi
    if [[ "${SECURE:-}" == 1 ]]; then files+=(-f "$DEPLOY/docker-compose.secure.yml"); fi
    if docker compose version > /dev/null 2>&1; then
        docker compose -p "$PROJECT" "${files[@]}" "$@"
    else
        docker-compose -p "$PROJECT" "${files[@]}" "$@"
    fi
)

# ---- images ----
pick_image() {  # MODEL: the default unless set; IMAGE: the tag that holds MODEL unless set
    MODEL="${MODEL:-$DEFAULT_MODEL}"
    if [[ "$MODEL" == "$DEFAULT_MODEL" ]]; then
        IMAGE="${IMAGE:-snapstream:0.1.0}"
    else
        IMAGE="${IMAGE:-snapstream:0.1.0-$MODEL}"
    fi
    export MODEL IMAGE
}

pick_stock_images() {  # STOCK_TAG: "" for the public images, snapstream-local where none pull
    if [[ -n "${STOCK_TAG+set}" ]]; then return; fi
    local image
    for image in "${PUBLIC_STOCK[@]}"; do
        if ! docker image inspect "$image" > /dev/null 2>&1 \
                && ! docker pull -q "$image" > /dev/null 2>&1; then
            say "$image cannot be pulled: using the images built from Debian's packages"
            STOCK_TAG=snapstream-local
            return
        fi
    done
    STOCK_TAG=""
}

build_images() {
    if [[ -n "$STOCK_TAG" ]]; then
        STOCK_TAG="$STOCK_TAG" "$DEPLOY/images/build.sh" all
    else
        PYTHON_IMAGE="${PUBLIC_STOCK[0]}" "$DEPLOY/images/build.sh" app
    fi
}

# ---- the cluster secret, which keys every blob's MAC: a new one each up ----
make_cluster_secret() {
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$STATE/cluster-secret"
    chmod 0600 "$STATE/cluster-secret"
    chown 10001:10001 "$STATE/cluster-secret" 2> /dev/null || chmod 0644 "$STATE/cluster-secret"
}

# ---- --secure: a CA, one certificate for every service, an API key ----
make_secrets() {
    mkdir -p "$STATE/tls"
    chmod 0755 "$STATE" "$STATE/tls"
    # made inside the image (the cryptography library is there, nothing on the host needs it),
    # owned by the services' user 10001
    docker run --rm --user 0:0 --entrypoint python -v "$STATE/tls:/out" "$IMAGE" -c '
import os
from pathlib import Path
from cluster.certs import make_cluster_certs
certs = make_cluster_certs(Path("/tmp/certs"), ("snapstream-internal", "localhost", "127.0.0.1"))
for name, source, mode in (("ca.crt", certs.ca, 0o644), ("tls.crt", certs.cert, 0o644),
                           ("tls.key", certs.key, 0o600)):
    out = Path("/out", name)
    out.write_bytes(source.read_bytes())
    os.chown(out, 10001, 10001)
    out.chmod(mode)
' > /dev/null || die "could not make the TLS files (in $IMAGE)"
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$STATE/api-keys"
    chmod 0600 "$STATE/api-keys"
    chown 10001:10001 "$STATE/api-keys" 2> /dev/null || chmod 0644 "$STATE/api-keys"
}

# ---- health ----
wait_healthy() {
    local deadline=$((SECONDS + ${UP_TIMEOUT_S:-600})) ids id state bad waiting
    while true; do
        mapfile -t ids < <(compose ps -q)
        ((${#ids[@]} > 0)) || die "compose started no container"
        waiting=0 bad=""
        for id in "${ids[@]}"; do
            state="$(docker inspect --format \
                '{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$id")"
            case "$state" in
                *" running healthy" | *" running none") ;;
                *" unhealthy" | *" exited "* | *" dead "*) bad="$state"; break ;;
                *) waiting=$((waiting + 1)) ;;
            esac
        done
        if [[ -n "$bad" ]]; then
            docker logs --tail 30 "${bad%% *}" >&2 || true
            die "${bad#/} (its last log lines above; \`deploy/compose.sh down\` removes the cluster)"
        fi
        ((waiting == 0)) && return
        ((SECONDS < deadline)) || die "$waiting containers not healthy after ${UP_TIMEOUT_S:-600} s"
        sleep 2
    done
}

up() {
    local store=redis secure=0
    while (($#)); do
        case "$1" in
            --store) store="${2:-}"; shift 2 || die "--store needs redis or nats" ;;
            --store=*) store="${1#*=}"; shift ;;
            --secure) secure=1; shift ;;
            --model) MODEL="${2:-}"; shift 2 || die "--model needs a model name" ;;
            --model=*) MODEL="${1#*=}"; shift ;;
            *) die "usage: deploy/compose.sh up [--store redis|nats] [--secure] [--model NAME]" ;;
        esac
    done
    local store_url
    case "$store" in
        redis) store_url="redis://:${REDIS_PASSWORD:-snapstream-dev}@redis:6379/0" ;;
        nats) store_url="nats://${NATS_USER:-snapstream}:${NATS_PASSWORD:-snapstream-dev}@nats:4222?max_bytes=4294967296" ;;
        *) die "--store is redis or nats, not '$store'" ;;
    esac
    ensure_docker
    if [[ -f "$STATE/settings.env" ]] || [[ -n "$(compose ps -q 2> /dev/null)" ]]; then
        say "a cluster of project $PROJECT is up: replacing it"
        down
    fi
    local start=$SECONDS
    pick_image
    pick_stock_images
    build_images
    mkdir -p "$STATE"
    make_cluster_secret
    if ((secure)); then make_secrets; fi
    cat > "$STATE/settings.env" << EOF
IMAGE=$IMAGE
MODEL=$MODEL
STOCK_TAG=$STOCK_TAG
STORE_URL=$store_url
SECURE=$secure
SECRETS_DIR=$STATE
ROUTER_PORT=${ROUTER_PORT:-50051}
HTTP_PORT=${HTTP_PORT:-8000}
EOF
    say "starting the cluster (model: $MODEL, store: $store$( ((secure)) && echo ', TLS and API key'))"
    compose up -d --no-build --remove-orphans >&2
    wait_healthy
    say "every service is healthy ($((SECONDS - start)) s)"
    local scheme=http
    ((secure)) && scheme=https
    echo "SNAPSTREAM_ADDR=127.0.0.1:${ROUTER_PORT:-50051}"
    echo "OPENAI_BASE_URL=$scheme://127.0.0.1:${HTTP_PORT:-8000}/v1"
    if ((secure)); then
        echo "SNAPSTREAM_TLS_CA=$STATE/tls/ca.crt"
        echo "SNAPSTREAM_API_KEY_FILE=$STATE/api-keys"
    fi
}

down() {
    if ! daemon_up; then
        say "no Docker daemon: nothing to remove"
        rm -rf "$STATE"
        return
    fi
    compose down --volumes --remove-orphans --timeout 45 >&2 || true
    # whatever a failed up or an edited compose file left with the project's label
    local kind label="label=com.docker.compose.project=$PROJECT"
    docker ps -aq --filter "$label" | xargs -r docker rm -f > /dev/null
    for kind in volume network; do
        docker "$kind" ls -q --filter "$label" | xargs -r docker "$kind" rm > /dev/null
    done
    rm -rf "$STATE"
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    compose) shift; daemon_up || die "the Docker daemon is not running"; compose "$@" ;;
    wait) daemon_up || die "the Docker daemon is not running"; wait_healthy ;;
    images) ensure_docker; pick_image; pick_stock_images; build_images ;;
    *) die "usage: deploy/compose.sh up [--store redis|nats] [--secure] [--model NAME] | down | wait | images | compose ARGS..." ;;
esac
