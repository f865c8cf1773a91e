# nats:snapstream-local, the stand-in for nats:2.10-alpine where no registry can be reached:
# Debian bookworm's nats-server (2.9) on the Debian base that build.sh makes, with the same
# command line (`nats-server -js -sd /data ...`), run as user `nats` (uid 998), and wget for the compose healthcheck.
ARG DEBIAN_IMAGE=snapstream-debian:bookworm
FROM ${DEBIAN_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Unpinned on purpose: bookworm's security updates replace these versions.
# hadolint ignore=DL3008
RUN groupadd --system --gid 998 nats \
    && useradd --system --uid 998 --gid nats --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin nats \
    && apt-get update \
    && apt-get install -y --no-install-recommends nats-server wget \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir /data && chown nats:nats /data
VOLUME /data
WORKDIR /data
USER 998:998
EXPOSE 4222 8222
CMD ["nats-server", "-js", "-sd", "/data"]
