#!/usr/bin/env bash
# The no-GPU demo in one command (`make demo`): the emulator, the exporter and Prometheus (plus
# Grafana when its image is here), from compose.yaml's emulated profile, with or without Docker Hub:
#
#   1. python -m glmserve.doctor checks .env, the profile and Docker before anything starts;
#   2. each base image (the tools image's Python, Prometheus) is used when present, pulled when a
#      registry answers, and otherwise replaced by a stand-in built from Debian and PyPI
#      (docker/ci-bases.sh), for this run only (.env is not changed);
#   3. Grafana joins when its image is present or pullable and GRAFANA_ADMIN_PASSWORD is set;
#      otherwise one line says why it is left out;
#   4. docker compose --profile emulated up --wait, then where to look.
#
# Every setting comes from .env and the shell as compose reads them (COMPOSE_PROJECT_NAME,
# COMPOSE_FILE and the ports too). Stop it with `docker compose --profile emulated down`.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
PY="${PYTHON:-$repo/.venv/bin/python}"
started=$SECONDS
say() { echo "demo: $*"; }
fail() { echo "demo: error: $*" >&2; exit 1; }
# Builds and compose talk a lot; their output goes here, and its tail to the screen on a failure.
build_log="$repo/.cache/demo.log"
mkdir -p "$repo/.cache" && : >"$build_log"
fail_with_log() { tail -n 25 "$build_log" >&2; fail "$* (the lines above; all of it in $build_log)"; }

[ -x "$PY" ] || fail "no $PY: run 'make venv' first (or set PYTHON to a Python with glmserve installed)"

services=(emulator exporter prometheus)
"$PY" -m glmserve.doctor --profile emulated "${services[@]}" || fail "fix the lines above, then run it again"

compose=(docker compose --profile emulated)
config="$("${compose[@]}" config --format json)" || fail "docker compose config failed (above)"
# setting PATH.TO.KEY [DEFAULT]: a value of the interpolated compose config.
setting() {
    "$PY" -c '
import json, sys
node = json.loads(sys.argv[1])
for key in sys.argv[2].split("."):
    node = node.get(key) if isinstance(node, dict) else None
print(sys.argv[3] if node in (None, "") else node)' "$config" "$1" "${2:-}"
}
# flag SERVICE --NAME: the value of --NAME=VALUE in that service's command.
flag() {
    "$PY" -c '
import json, sys
command = json.loads(sys.argv[1])["services"][sys.argv[2]]["command"]
print(next(a.split("=", 1)[1] for a in command if a.startswith(sys.argv[3] + "=")))' "$config" "$1" "$2"
}
dockerfile_default() { sed -n "s/^ARG $1=//p" Dockerfile | head -n1; }

# Present here, or pulled now (a registry that does not answer fails fast or in 2 minutes).
available() {
    docker image inspect "$1" >/dev/null 2>&1 && return 0
    timeout 120 docker pull -q "$1" >/dev/null 2>&1
}

# GLMSERVE_PULL_POLICY=never: the tools image is used as it is (an offline bundle), not built.
build_tools="$([ "$(setting services.doctor.pull_policy build)" = never ] && echo no || echo yes)"
tools_base="$(setting services.doctor.build.args.TOOLS_BASE_IMAGE "$(dockerfile_default TOOLS_BASE_IMAGE)")"
prometheus_image="$(setting services.prometheus.image)"
stand_ins=()
[ "$build_tools" = no ] || available "$tools_base" || stand_ins+=(tools)
available "$prometheus_image" || stand_ins+=(prometheus)
if [ ${#stand_ins[@]} -gt 0 ]; then
    say "no registry for ${stand_ins[*]} ($tools_base, $prometheus_image): building stand-ins from Debian and PyPI (docker/ci-bases.sh; a few minutes the first time)"
    bases="$(docker/ci-bases.sh "${stand_ins[@]}" 2>>"$build_log")" || fail_with_log "docker/ci-bases.sh failed"
    while IFS='=' read -r key value; do
        [ -n "$key" ] && export "$key=$value"
    done <<<"$bases"
    # Only this run uses them; other compose commands (a launcher dry run, Locust's profile)
    # build from the same bases once .env names them: one NAME=VALUE per line, as .env takes
    # them (printed on one line, a paste made one value of both, and the build failed).
    say "for other docker compose commands on this host, add these lines to .env:"
    printf '%s\n' $bases
fi

# pip inside the tools build goes through this host's network; behind a TLS-intercepting proxy
# it needs the CA this host trusts (docker/build-ca/README.md). Only the throw-away build stage
# sees .ca/; no image keeps it.
host_ca=/etc/ssl/certs/ca-certificates.crt
if [ -f "$host_ca" ] && [ -z "$(find .ca -maxdepth 1 -type f \( -name '*.crt' -o -name '*.pem' \) 2>/dev/null)" ]; then
    mkdir -p .ca
    cp "$host_ca" ".ca/.host-ca-bundle.crt.$$" && mv ".ca/.host-ca-bundle.crt.$$" .ca/host-ca-bundle.crt
    say "trusting this host's CA bundle in the tools build (.ca/host-ca-bundle.crt, build stage only)"
fi

grafana_image="$(setting services.grafana.image)"
if [ -z "$(setting services.grafana.environment.GF_SECURITY_ADMIN_PASSWORD)" ]; then
    say "Grafana left out: GRAFANA_ADMIN_PASSWORD is not set in .env (the preview below draws the same panels)"
elif ! available "$grafana_image"; then
    say "Grafana left out: its image $grafana_image is not here and cannot be pulled (the preview below draws the same panels)"
else
    services+=(grafana)
fi

if [ "$build_tools" = yes ]; then
    say "building the tools image (docker compose build doctor; pip from PyPI the first time)"
    "${compose[@]}" build doctor >>"$build_log" 2>&1 || fail_with_log "the tools image did not build"
fi
say "starting ${services[*]} (docker compose --profile emulated up)"
"${compose[@]}" up -d --no-build --wait --wait-timeout 300 "${services[@]}" >>"$build_log" 2>&1 \
    || fail_with_log "compose did not bring the demo up healthy; docker compose --profile emulated logs"

sglang="http://$(flag emulator --host):$(flag emulator --port)"
exporter="http://$(flag exporter --web.listen-address)"
prometheus="http://$(flag prometheus --web.listen-address)"
say "up in $((SECONDS - started)) s: ${services[*]}"
echo "  OpenAI API (the emulator: --tpot-ms=$(flag emulator --tpot-ms) --cost-model=$(flag emulator --cost-model))  $sglang/v1"
echo "  exporter                $exporter/metrics"
echo "  Prometheus              $prometheus"
if [[ " ${services[*]} " == *" grafana "* ]]; then
    echo "  Grafana, dashboard TPOT http://$(setting services.grafana.environment.GF_SERVER_HTTP_ADDR):$(setting services.grafana.environment.GF_SERVER_HTTP_PORT)"
fi
echo "TPOT in Prometheus (the lines fill in over the first minutes):"
"$PY" -m glmserve.dashboard.preview --prometheus "$prometheus" --links | sed 's/^/  /'
echo "The dashboard as a PNG, without Grafana:"
echo "  .venv/bin/python -m glmserve.dashboard.preview --prometheus $prometheus --output dashboard-preview.png"
echo "Load it (another shell):"
# The dashboard's SLO line and alerts use the exporter's TPOT_SLO_S: the run judges by it too.
slo_ms="$("$PY" -c 'from glmserve.exporter.canary import TPOT_SLO_S; print(f"{TPOT_SLO_S * 1000:g}")')"
echo "  . .venv/bin/activate && locust -f loadtest/decode.py --headless -H $sglang -u 8 --measure-s 60 --slo-tpot-ms $slo_ms"
echo "Stop: docker compose --profile emulated down"
