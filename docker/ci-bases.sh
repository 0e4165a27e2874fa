#!/usr/bin/env bash
# Build the local base images CI substitutes for registry images (nothing can be pulled there):
#
#   local/debian:bookworm               debootstrap minbase, imported (skipped if present)
#   glmserve-ci/python:3.11-bookworm    + Debian's python3/venv/pip  -> TOOLS_BASE_IMAGE
#   glmserve-ci/sglang:<line>           + that line's sglang wheel, no GPU deps -> BASE_IMAGE
#                                       (the Dockerfile's SGLANG_LINE, or GLMSERVE_CI_SGLANG_LINE)
#   glmserve-ci/prometheus:2.42-bookworm  Debian's prometheus        -> PROMETHEUS_IMAGE
#
# Arguments pick which (tools, sglang, prometheus; default all): `make demo` needs no SGLang base.
# Idempotent: the debootstrap import is skipped when the image exists, and docker's layer cache
# makes a repeated build take about a second. Prints the tags as KEY=VALUE lines on stdout
# (progress goes to stderr), so callers can `eval` or parse them.
set -euo pipefail
wanted=" ${*:-tools sglang prometheus} "
for base in $wanted; do
    case "$base" in tools|sglang|prometheus) ;; *) echo "ci-bases.sh: unknown base '$base' (tools, sglang, prometheus)" >&2; exit 2 ;; esac
done
want() { [[ "$wanted" == *" $1 "* ]]; }
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

debian_image="${GLMSERVE_CI_DEBIAN_IMAGE:-local/debian:bookworm}"
python_image="glmserve-ci/python:3.11-bookworm"
prometheus_image="glmserve-ci/prometheus:2.42-bookworm"
# One source of truth for the SGLang line: the Dockerfile's ARG default, unless
# GLMSERVE_CI_SGLANG_LINE asks for another line's stand-in (CI builds the server on each line).
sglang_version="${GLMSERVE_CI_SGLANG_LINE:-$(sed -n 's/^ARG SGLANG_LINE=//p' Dockerfile)}"
[ -n "$sglang_version" ] || { echo "ci-bases.sh: no 'ARG SGLANG_LINE=' in Dockerfile" >&2; exit 1; }
case "$sglang_version" in *[!0-9a-z.]*) echo "ci-bases.sh: bad SGLang line '$sglang_version'" >&2; exit 2 ;; esac
sglang_image="glmserve-ci/sglang:${sglang_version}"
cache="$repo/.cache/stack"
mkdir -p "$cache/wheels"

log() { echo "[ci-bases +${SECONDS}s] $*" >&2; }
build() {  # build TAG DOCKERFILE CONTEXT [docker build args...]
    local tag="$1" file="$2" context="$3"
    shift 3
    log "building $tag"
    docker build --network host -q -t "$tag" -f "$file" "$@" "$context" >/dev/null
}

if ! docker image inspect "$debian_image" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || { echo "ci-bases.sh: $debian_image is missing and debootstrap is not installed" >&2; exit 1; }
    mirror="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    mirror="${mirror:-http://deb.debian.org/debian}"
    rootfs="$(mktemp -d /tmp/glmserve-rootfs.XXXXXX)"
    log "debootstrap bookworm from $mirror (about a minute)"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 \
        || { echo "ci-bases.sh: debootstrap failed, see $cache/debootstrap.log" >&2; rm -rf "$rootfs"; exit 1; }
    tar -C "$rootfs" -c . | docker import - "$debian_image" >/dev/null
    rm -rf "$rootfs"
fi

if want tools || want sglang; then
    build "$python_image" docker/python-bookworm.Dockerfile docker --build-arg "DEBIAN_IMAGE=$debian_image"
fi
if want prometheus; then
    build "$prometheus_image" docker/prometheus-bookworm.Dockerfile docker --build-arg "DEBIAN_IMAGE=$debian_image"
fi
if ! want sglang; then
    want tools && echo "TOOLS_BASE_IMAGE=$python_image"
    want prometheus && echo "PROMETHEUS_IMAGE=$prometheus_image"
    log "done"
    exit 0
fi

wheel="$(ls "$cache/wheels"/sglang-"$sglang_version"-*.whl 2>/dev/null | head -n1 || true)"
if [ -z "$wheel" ]; then
    log "downloading sglang==$sglang_version (wheel only, no dependencies)"
    # The host's pip (with the host's CA settings) fetches it; the image build stays offline.
    "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux_2_34_x86_64 -d "$cache/wheels" "sglang==$sglang_version" >&2
    wheel="$(ls "$cache/wheels"/sglang-"$sglang_version"-*.whl | head -n1)"
fi
context="$(mktemp -d /tmp/glmserve-sglang-ctx.XXXXXX)"
trap 'rm -rf "$context"' EXIT
cp "$wheel" "$context/"
build "$sglang_image" docker/sglang-base.Dockerfile "$context" --build-arg "PYTHON_IMAGE=$python_image"

want tools && echo "TOOLS_BASE_IMAGE=$python_image"
echo "BASE_IMAGE=$sglang_image"
want prometheus && echo "PROMETHEUS_IMAGE=$prometheus_image"
echo "SGLANG_VERSION=$sglang_version"
echo "SGLANG_LINE=$sglang_version"
log "done"
