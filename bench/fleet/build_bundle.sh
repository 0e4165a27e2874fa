#!/bin/bash
# Build the fleet bench's device bundle in one command (the H200 has no network):
#   bench/fleet/build_bundle.sh [OUT.tar.xz]        (default .cache/fleet/fleet.tar.xz, git-ignored)
# 1. the SGLang 0.5.12.post1 overlay from ../shared/tools/sglang-device-bundle.sh (built once
#    into .cache/e2e/base and shared with bench/e2e/build_bundle.sh);
# 2. a copy patched with OUR series (patches/apply.py, then --check), plus src/glmserve, the
#    launch profiles and the tiny MLA model;
# 3. the pinned router, sglang-router 0.3.2 (cp38-abi3 wheel), and our Locust suite's pinned
#    dependencies for Python 3.12 (locust, gevent, geventhttpclient, flask, ...): the versions
#    in constraints.txt;
# 4. debug sections stripped from the large shared objects (strip --strip-debug: code, symbols
#    and the dynamic table are untouched; xgrammar's 53 MB .so is 94% DWARF), so everything fits
#    the device tool's 64 MiB carry limit; packed with xz, refused over 62 MiB.
# On the device: bash bench/fleet/device.sh   (unpacks to /tmp/fleet, runs fleet_bench.py).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
OUT=$(realpath -m "${1:-.cache/fleet/fleet.tar.xz}")
TOOL=${SGLANG_DEVICE_BUNDLE:-$REPO/../shared/tools/sglang-device-bundle.sh}
[ -f "$TOOL" ] || TOOL=/work/shared/tools/sglang-device-bundle.sh
BASE=$REPO/.cache/e2e/base/site
WORK=$REPO/.cache/fleet
STAGE=$WORK/stage
[ -f "$TOOL" ] || { echo "overlay tool not found: $TOOL (set SGLANG_DEVICE_BUNDLE)" >&2; exit 2; }
command -v strip >/dev/null || { echo "strip (binutils) is needed" >&2; exit 2; }
pin() { grep -i "^$1==" constraints.txt | head -n1 || { echo "no pin for $1 in constraints.txt" >&2; exit 2; }; }

STAMP=$(sha256sum "$TOOL" | cut -c1-16)
if [ "$(cat "$BASE/.e2e-stamp" 2>/dev/null)" != "$STAMP" ]; then
  WHEEL_CACHE=$REPO/.cache/e2e/wheels VENV=$REPO/.cache/e2e/venv312 bash "$TOOL" "$BASE"
  echo "$STAMP" > "$BASE/.e2e-stamp"
fi

rm -rf "$STAGE"; mkdir -p "$STAGE" "$WORK/wheels"
cp -a "$BASE" "$STAGE/site"
python3 patches/apply.py --target "$STAGE/site"
python3 patches/apply.py --target "$STAGE/site" --check
rm -rf "$STAGE/site/glmserve"; cp -a src/glmserve "$STAGE/site/glmserve"
mkdir -p "$STAGE/models" "$STAGE/profiles"
cp -a entrypoint/profiles/*.json "$STAGE/profiles/"
cp -a entrypoint/models/tiny-mla "$STAGE/models/"

# Router + Locust stack, pinned by constraints.txt; werkzeug too (Flask 3.1 needs >= 3.1).
PKGS=("$(pin sglang-router)")
for p in locust gevent geventhttpclient greenlet zope.event zope.interface flask flask-cors \
         flask-login configargparse python-engineio python-socketio simple-websocket wsproto \
         bidict brotli blinker itsdangerous werkzeug; do
  PKGS+=("$(pin "$p")")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d "$WORK/wheels" "${PKGS[@]}"
for p in "${PKGS[@]}"; do
  n=$(echo "${p%%==*}" | tr 'A-Z-' 'a-z_'); v=${p##*==}
  w=$(ls "$WORK/wheels" | tr 'A-Z' 'a-z' | grep -n "^${n//./_}-${v}-" | head -n1 | cut -d: -f1)
  [ -n "$w" ] || { echo "no wheel for $p" >&2; exit 1; }
  python3 -m zipfile -e "$WORK/wheels/$(ls "$WORK/wheels" | sed -n "${w}p")" "$STAGE/site"
done
# Locust's web UI is never served here (headless); the router's Python MiniLB is never used.
find "$STAGE/site" -name '*.so' -size +1M -exec strip --strip-debug {} +
find "$STAGE" -name __pycache__ -type d -prune -exec rm -rf {} +
{
  echo "{\"git_head\": \"$(git rev-parse HEAD)\", \"git_dirty\": $( [ -z "$(git status --porcelain -- src patches entrypoint bench/fleet loadtest)" ] && echo false || echo true ),"
  echo " \"built\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"overlay_tool_sha256_16\": \"$STAMP\", \"extra\": \"${PKGS[*]}\"}"
} > "$STAGE/site/.fleet-bundle.json"
mkdir -p "$(dirname "$OUT")"
( cd "$STAGE" && XZ_OPT="-T0 -9" tar -cJf "$OUT" site models profiles )
size=$(stat -c %s "$OUT")
echo "bundle: $OUT ($((size / 1024 / 1024)) MiB)"
[ "$size" -le $((62 * 1024 * 1024)) ] || { echo "bundle is over 62 MiB: it would not fit the carry limit" >&2; exit 1; }
