# python:snapstream-local, the stand-in for python:3.11-slim-bookworm where no registry can be
# reached: Debian bookworm's Python 3.11 (`python` and `python3`, venv with its bundled pip)
# on the Debian base that build.sh makes with mmdebstrap. deploy/Dockerfile builds on it.
ARG DEBIAN_IMAGE=snapstream-debian:bookworm
FROM ${DEBIAN_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Unpinned on purpose: bookworm's security updates replace these versions, and the base's apt
# sources fix the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
        python-is-python3 libpython3.11-dev \
    && rm -rf /var/lib/apt/lists/* \
    && python --version
ENV LANG=C.UTF-8
CMD ["python"]
