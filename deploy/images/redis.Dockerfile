# redis:snapstream-local, the stand-in for redis:7.4-alpine where no registry can be reached:
# Debian bookworm's redis-server (7.0) on the Debian base that build.sh makes. It runs as the
# user `redis` (uid 999, as in the official image) in /data and takes the same command line
# (`redis-server --requirepass ...`); redis-cli is there for the compose healthcheck.
ARG DEBIAN_IMAGE=snapstream-debian:bookworm
FROM ${DEBIAN_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Unpinned on purpose: bookworm's security updates replace these versions.
# hadolint ignore=DL3008
RUN groupadd --system --gid 999 redis \
    && useradd --system --uid 999 --gid redis --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin redis \
    && apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir /data && chown redis:redis /data
VOLUME /data
WORKDIR /data
USER 999:999
EXPOSE 6379
CMD ["redis-server"]
