#!/usr/bin/env bash
# Build the carry bundle for the H200 proof and benchmark (bench/device_run.sh):
# a PYTHONPATH overlay with the real SGLang 0.5.12.post1 wheel, FlashInfer 0.6.11.post1 and
# apache-tvm-ffi 0.1.9 for Python 3.12, built by ../shared/tools/sglang-device-bundle.sh.
#
#   usage: bench/bundle.sh [OUT.tar.xz]      (default .bundle/sglang-0.5.12.post1.tar.xz)
#
# The overlay is packed UNPATCHED on purpose: the device command applies the committed series
# with patches/apply.py, so the GPU runs exactly the diff in the working tree, through the tool.
# Env: SGLANG_BUNDLE_TOOL (default /work/shared/tools/sglang-device-bundle.sh), WHEEL_CACHE.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.bundle/sglang-0.5.12.post1.tar.xz}
tool=${SGLANG_BUNDLE_TOOL:-/work/shared/tools/sglang-device-bundle.sh}
[ -x "$tool" ] || { echo "bundle: $tool not found or not executable (set SGLANG_BUNDLE_TOOL)" >&2; exit 2; }
work=.cache/kernel-bundle
site=$work/site
mkdir -p "$work" "$(dirname "$out")"
WHEEL_CACHE=${WHEEL_CACHE:-$work/wheels} VENV=${VENV:-$work/v312} "$tool" "$site"
# FlashInfer JIT-compiles its MLA kernels there: the CUDA sources must be in the overlay.
for f in flashinfer/data/csrc/batch_mla_run.cu flashinfer/data/csrc/batch_mla_plan.cu \
         flashinfer/data/csrc/batch_mla_config.jinja flashinfer/data/include/flashinfer/attention/mla.cuh \
         sglang/srt/layers/attention/flashinfer_mla_backend.py; do
  [ -f "$site/$f" ] || { echo "bundle: $f missing from the overlay" >&2; exit 1; }
done
# Refuse a pre-patched tree: the device run must apply the series itself.
[ ! -e "$site/sglang/srt/layers/attention/fp8_kv_gather.py" ] || { echo "bundle: overlay is already patched" >&2; exit 1; }
( cd "$work" && XZ_OPT="-T0 -6" tar -cJf "$OLDPWD/$out" site )
echo "bundle: $out $(( $(stat -c %s "$out") / 1048576 )) MiB"
