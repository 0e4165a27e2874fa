#!/usr/bin/env bash
# Every image the stack runs, moved to a host without a registry (air-gapped GPU clusters).
#
#   docker/offline-images.sh save DIR [--with-server]   # where Docker Hub and PyPI are reachable
#   docker/offline-images.sh load DIR                   # on the air-gapped host, from the repo root
#   docker/offline-images.sh refs [--with-server]       # only list the images save would take
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
# Image names are compose's own answer (`docker compose config`): .env, the shell and nested
# defaults (GLMSERVE_IMAGE's default holds ${SGLANG_LINE}) count as they do for `up`. Each is
# written back under its variable (PROMETHEUS_IMAGE, GRAFANA_IMAGE, GLMSERVE_TOOLS_IMAGE,
# GLMSERVE_IMAGE), so the loaded .env names the same images.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "offline-images.sh: error: $*" >&2; exit 2; }
log() { echo "[offline-images] $*" >&2; }

# The service whose image each variable names.
declare -A SERVICE_OF=([PROMETHEUS_IMAGE]=prometheus [GRAFANA_IMAGE]=grafana
    [GLMSERVE_TOOLS_IMAGE]=doctor [GLMSERVE_IMAGE]=sglang)
config_json=""
ref_of() {  # VAR -> the image compose would run for its service
    if [ -z "$config_json" ]; then
        config_json="$(COMPOSE_PROFILES=gpu docker compose config --format json)" \
            || die "docker compose config failed (above); fix .env first (python -m glmserve.doctor)"
    fi
    python3 -c 'import json, sys; print(json.loads(sys.argv[1])["services"][sys.argv[2]].get("image", ""))' \
        "$config_json" "${SERVICE_OF[$1]}"
}
variables() {  # [--with-server]: the variables whose images a bundle holds
    echo PROMETHEUS_IMAGE GRAFANA_IMAGE GLMSERVE_TOOLS_IMAGE
    [ "${1:-}" = 1 ] && echo GLMSERVE_IMAGE
    return 0
}
tag_of() { echo "${1%%@*}"; }  # name:tag@sha256:... -> name:tag

save() {
    local dir=$1 with_server=$2
    mkdir -p "$dir"
    local refs=() vars
    read -r -a vars <<<"$(variables "$with_server" | tr '\n' ' ')"
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
refs)
    case "$#:${2:-}" in 1:) server=0 ;; 2:--with-server) server=1 ;; *) die "usage: docker/offline-images.sh refs [--with-server]" ;; esac
    for var in $(variables "$server"); do echo "$var=$(ref_of "$var")"; done
    ;;
*) die "usage: docker/offline-images.sh save DIR [--with-server] | load DIR | refs [--with-server]" ;;
esac
