#!/usr/bin/env bash
# Rewrite the Dockerfile's PATCH_LOCK_SHA256 default from patches/series.lock.json, and check that
# every SGLang line the image builds (glmserve.sglang_lines) is its own source series in the lock.
# Run it after regenerating the lock (python -m glmserve.series.regen); the image build refuses
# a label that disagrees with what apply.py recorded, and tests/stack checks the default.
set -euo pipefail
cd "$(dirname "$0")/.."
lock="$(sha256sum patches/series.lock.json | cut -d' ' -f1)"
PYTHONPATH=src python3 - <<'PY'
import json, sys
from glmserve.sglang_lines import LINES
entries = json.load(open("patches/series.lock.json"))["series"]
for line in LINES:
    if entries.get(line, {}).get("source") != line:
        sys.exit(f"sync-lock-labels: patches/series.lock.json has no source series {line} (a line the image builds)")
PY
sed -i -e "s/^ARG PATCH_LOCK_SHA256=.*/ARG PATCH_LOCK_SHA256=${lock}/" Dockerfile
grep -E '^ARG PATCH_LOCK_SHA256=' Dockerfile
