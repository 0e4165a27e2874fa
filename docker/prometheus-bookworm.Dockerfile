# CI-only stand-in for the pinned prom/prometheus image (PROMETHEUS_IMAGE): Debian's Prometheus
# 2.42 on the debootstrap base, laid out like the official image (binary as ENTRYPOINT, TSDB in
# /prometheus owned by nobody) so compose.yaml's prometheus service runs it unchanged.
ARG DEBIAN_IMAGE=local/debian:bookworm
FROM ${DEBIAN_IMAGE}
# Versions are fixed by the mirror snapshot the base was bootstrapped from.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus \
    && chown nobody:nogroup /prometheus
USER 65534:65534
WORKDIR /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
