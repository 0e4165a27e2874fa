#!/usr/bin/env bash
# Every image the stack runs, moved to a host without a registry (air-gapped GPU clusters).
#
#   docker/offline-images.sh save DIR [--with-server]   # where Docker Hub and PyPI are reachable
#   docker/offline-images.sh load DIR                   # on the air-gapped host, from the repo root
#
# save: builds the tools image (and with --with-server the patched server image, ~20 GB) through
# compose, pulls Prometheus and Grafana by their pinned digests, and writes DIR/images.tar
# (docker save), DIR/images.env (the .env lines that point compose at these images) and
# DIR/images.ids (each image's ID). Images are saved under their tags: a digest reference
# (name:tag@sha256:...) means "from a registry", which the air-gapped host has not got.
# load: docker load, then checks every image ID against DIR/images.ids (what was pulled by
# digest is what arrived) and prints images.env. Append it to .env:
#
#   docker/offline-images.sh load DIR >> .env && docker compose --profile emulated up
#
# Image names come from compose's own variables (PROMETHEUS_IMAGE, GRAFANA_IMAGE,
# GLMSERVE_TOOLS_IMAGE, GLMSERVE_IMAGE), so .env overrides apply to both ends.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "offline-images.sh: error: $*" >&2; exit 2; }
log() { echo "[offline-images] $*" >&2; }

compose_default() {  # the default of ${NAME:-default} in compose.yaml
    sed -n "s/.*\${$1:-\([^}]*\)}.*/\1/p" compose.yaml | head -n1
}
ref_of() { local name=$1; echo "${!name:-$(compose_default "$name")}"; }
tag_of() { echo "${1%%@*}"; }  # name:tag@sha256:... -> name:tag

save() {
    local dir=$1 with_server=$2
    mkdir -p "$dir"
    local refs=() vars=(PROMETHEUS_IMAGE GRAFANA_IMAGE GLMSERVE_TOOLS_IMAGE)
    [ "$with_server" = 1 ] && vars+=(GLMSERVE_IMAGE)
    # OFFLINE_NO_BUILD=1: save the images as they are (already built; the tests use it).
    if [ -z "${OFFLINE_NO_BUILD:-}" ]; then
        local services=(doctor)  # the service that builds the tools image
        [ "$with_server" = 1 ] && services+=(sglang)
        log "building ${services[*]} through compose"
        COMPOSE_PROFILES=gpu docker compose build "${services[@]}" >&2
    fi
    : >"$dir/images.env"
    : >"$dir/images.ids"
    echo "# Images loaded by docker/offline-images.sh (no registry needed); compose uses them as they are." >>"$dir/images.env"
    for var in "${vars[@]}"; do
        local ref tag
        ref=$(ref_of "$var")
        [ -n "$ref" ] || die "no image for $var in compose.yaml or the environment"
        tag=$(tag_of "$ref")
        if ! docker image inspect "$ref" >/dev/null 2>&1; then
            log "pulling $ref"
            docker pull "$ref" >&2 || die "cannot pull $ref (run save where the registry is reachable)"
        fi
        [ "$tag" = "$ref" ] || docker tag "$ref" "$tag"
        echo "$tag $(docker image inspect --format '{{.Id}}' "$tag")" >>"$dir/images.ids"
        echo "$var=$tag" >>"$dir/images.env"
        refs+=("$tag")
    done
    echo "GLMSERVE_PULL_POLICY=never" >>"$dir/images.env"
    log "saving ${#refs[@]} images to $dir/images.tar"
    docker save -o "$dir/images.tar" "${refs[@]}"
    log "done: copy $dir to the air-gapped host, then: docker/offline-images.sh load $dir >> .env"
}

load() {
    local dir=$1
    [ -f "$dir/images.tar" ] && [ -f "$dir/images.ids" ] && [ -f "$dir/images.env" ] \
        || die "$dir is not a bundle from 'docker/offline-images.sh save' (images.tar, images.ids, images.env)"
    log "loading $dir/images.tar"
    docker load -i "$dir/images.tar" >&2 || die "docker load failed for $dir/images.tar"
    local tag want got
    while read -r tag want; do
        got=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null) \
            || die "$tag is not in $dir/images.tar"
        [ "$got" = "$want" ] || die "$tag loaded as $got, but the bundle recorded $want (a changed or mixed-up bundle)"
    done <"$dir/images.ids"
    log "all $(wc -l <"$dir/images.ids") images verified; the .env lines follow on stdout"
    cat "$dir/images.env"
}

case "${1:-}" in
save)
    case "$#:${3:-}" in
    2:) save "$2" 0 ;;
    3:--with-server) save "$2" 1 ;;
    *) die "usage: docker/offline-images.sh save DIR [--with-server]" ;;
    esac
    ;;
load)
    [ $# -eq 2 ] || die "usage: docker/offline-images.sh load DIR"
    load "$2"
    ;;
*) die "usage: docker/offline-images.sh save DIR [--with-server] | load DIR" ;;
esac
