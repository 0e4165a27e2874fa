#!/bin/bash
# Build the e2e device bundle in one command:
#   bench/e2e/build_bundle.sh [OUT.tar.xz]      (default .cache/e2e/e2e.tar.xz, git-ignored; not
#   under .bundle/, which bench/device_run.sh carries whole: two bundles would pass 64 MiB)
# 1. the SGLang 0.5.12.post1 overlay from ../shared/tools/sglang-device-bundle.sh (built once into
#    .cache/e2e/base and reused: it is ~300 MB of pinned wheels that never change);
# 2. a fresh copy of it patched with OUR series: python3 patches/apply.py --target SITE, then --check;
# 3. our package (src/glmserve) and the tiny MLA models (entrypoint/models/tiny-mla*);
# 4. packed with xz, refused if over 60 MiB (the device tool carries at most 64 MiB in all).
# On the device: bash bench/e2e/device.sh  (unpacks it to /tmp/e2e and runs bench/e2e/harness.py).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
OUT=$(realpath -m "${1:-.cache/e2e/e2e.tar.xz}")
TOOL=${SGLANG_DEVICE_BUNDLE:-$REPO/../shared/tools/sglang-device-bundle.sh}
WORK=$REPO/.cache/e2e
BASE=$WORK/base/site
STAGE=$WORK/stage
[ -f "$TOOL" ] || { echo "overlay tool not found: $TOOL (set SGLANG_DEVICE_BUNDLE)" >&2; exit 2; }
ls entrypoint/models/tiny-mla/config.json >/dev/null 2>&1 \
  || { echo "entrypoint/models/tiny-mla/config.json is missing (the launcher's tiny model)" >&2; exit 2; }

# The stamp names the tool's content: a changed overlay recipe rebuilds the base.
STAMP=$(sha256sum "$TOOL" | cut -c1-16)
if [ "$(cat "$BASE/.e2e-stamp" 2>/dev/null)" != "$STAMP" ]; then
  WHEEL_CACHE=$WORK/wheels VENV=$WORK/venv312 bash "$TOOL" "$BASE"
  echo "$STAMP" > "$BASE/.e2e-stamp"
fi

rm -rf "$STAGE"; mkdir -p "$STAGE"
cp -a "$BASE" "$STAGE/site"
python3 patches/apply.py --target "$STAGE/site"
python3 patches/apply.py --target "$STAGE/site" --check
# Our package goes beside SGLang so the launcher, streaming client and canary run from the bundle.
rm -rf "$STAGE/site/glmserve"
cp -a src/glmserve "$STAGE/site/glmserve"
mkdir -p "$STAGE/models" "$STAGE/profiles"
cp -a entrypoint/profiles/*.json "$STAGE/profiles/"
cp -a entrypoint/models/tiny-mla* "$STAGE/models/"
find "$STAGE" -name __pycache__ -type d -prune -exec rm -rf {} +
# Provenance: which commit and series this bundle was built from.
{
  echo "{\"git_head\": \"$(git rev-parse HEAD)\", \"git_dirty\": $( [ -z "$(git status --porcelain -- src patches entrypoint)" ] && echo false || echo true ),"
  echo " \"built\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"overlay_tool_sha256_16\": \"$STAMP\"}"
} > "$STAGE/site/.e2e-bundle.json"
mkdir -p "$(dirname "$OUT")"
( cd "$STAGE" && XZ_OPT="-T0 -9" tar -cJf "$OUT" site models profiles )
size=$(stat -c %s "$OUT")
echo "bundle: $OUT ($((size / 1024 / 1024)) MiB)"
[ "$size" -le $((60 * 1024 * 1024)) ] || { echo "bundle is over 60 MiB: it would not fit the carry limit" >&2; exit 1; }
