# CI-only stand-in for the pinned python slim image (TOOLS_BASE_IMAGE) and the root of the
# local "SGLang base": the registry is unreachable in CI, so everything starts from the
# debootstrap image docker/ci-bases.sh imports. Debian bookworm's CPython is 3.11, the same
# minor version the tools image pins and one the pinned SGLang ships wheels for.
ARG DEBIAN_IMAGE=local/debian:bookworm
FROM ${DEBIAN_IMAGE}
# Versions come from the same snapshot of the Debian mirror the base was bootstrapped from,
# so they are fixed by that snapshot; pinning them again here would only break on a point release.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/*
