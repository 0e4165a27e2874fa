#!/usr/bin/env bash
# Rewrite the Dockerfile's PATCH_SERIES / PATCH_LOCK_SHA256 defaults from patches/series.lock.json.
# Run it after regenerating the lock (python -m glmserve.series.regen); the image build refuses
# labels that disagree with what apply.py recorded, and tests/stack checks the defaults.
# PATCH_SERIES is the source series the lock maps the Dockerfile's SGLANG_VERSION to.
set -euo pipefail
cd "$(dirname "$0")/.."
version="$(sed -n 's/^ARG SGLANG_VERSION=//p' Dockerfile)"
lock="$(sha256sum patches/series.lock.json | cut -d' ' -f1)"
series="$(python3 - "${version}" <<'PY'
import json, sys
version = sys.argv[1]
entries = json.load(open("patches/series.lock.json"))["series"]
if version not in entries:
    sys.exit(f"sync-lock-labels: patches/series.lock.json has no series for SGLang {version}")
print(entries[version]["source"])
PY
)"
sed -i -e "s/^ARG PATCH_SERIES=.*/ARG PATCH_SERIES=${series}/" \
    -e "s/^ARG PATCH_LOCK_SHA256=.*/ARG PATCH_LOCK_SHA256=${lock}/" Dockerfile
grep -E '^ARG PATCH_(SERIES|LOCK_SHA256)=' Dockerfile
