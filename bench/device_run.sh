#!/usr/bin/env bash
# ONE device call on the H200 (see docs/patch.md): unpack the SGLang overlay from bench/bundle.sh,
# apply the committed series with the real tool, then run the GPU tests (a)(b)(c), the startup
# self-test and the benchmark. Everything lands in $OUT (at most 8 files come back).
#   usage (device tool, carry .bundle/sglang-0.5.12.post1.tar.xz): bash bench/device_run.sh [BENCH ARGS]
# Optional carried inputs:
#   .bundle/jit-cache.tar.xz   FlashInfer/Triton JIT cache shipped back by an earlier call
#   $KERNEL_VARIANTS/*.py      candidate kernels: compared first (bitwise check + gather timings);
#                              the fastest correct one, with its launch shape, replaces the installed
#                              fp8_kv_gather.py for everything after, and comes back in $OUT so the
#                              series can ship exactly those bytes.
set -uo pipefail
: "${OUT:?OUT must name the folder that comes back}"
log=$OUT/device.log
step() { echo "=== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }
mkdir -p /tmp/x && tar -xJf .bundle/sglang-0.5.12.post1.tar.xz -C /tmp/x || exit 1
SITE=/tmp/x/site
KERNEL=$SITE/sglang/srt/layers/attention/fp8_kv_gather.py
export PYTHONPATH=$SITE:$PWD/src HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MAX_JOBS=16 \
  FLASHINFER_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
if [ -f .bundle/jit-cache.tar.xz ]; then tar -xJf .bundle/jit-cache.tar.xz -C "$HOME" && step "restored JIT cache"; fi
step "device"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1 | tee -a "$log"
step "apply series"; python3 patches/apply.py --target "$SITE" 2>&1 | tee -a "$log"
python3 patches/apply.py --target "$SITE" --check 2>&1 | tee -a "$log"
python3 -m glmserve.patching.verify --target "$SITE" 2>&1 | tee -a "$log"
if [ -n "${KERNEL_VARIANTS:-}" ]; then
  step "kernel variants"
  python3 bench/gather_cast.py --out "$OUT" --no-fp8-native --variants "$KERNEL_VARIANTS"/*.py \
    --write-best "$KERNEL" 2>&1 | grep -E "^installed|ceiling|Error|error" | tee -a "$log"
  cp "$KERNEL" "$OUT/fp8_kv_gather.py"; sha256sum "$KERNEL" | tee -a "$log"
fi
step "self-test"; t0=$SECONDS
python3 -m glmserve.patching.selftest 2>&1 | tee -a "$log"; echo "rc=${PIPESTATUS[0]} wall=$((SECONDS - t0)) s" | tee -a "$log"
step "GPU tests"; python3 -m pytest -v -s -rA -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|^\[|passed|failed" | tee -a "$log"
step "benchmark"; python3 bench/gather_cast.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -45
step "done"
if [ -z "${KERNEL_VARIANTS:-}" ]; then
  tar -cJf "$OUT/jit-cache.tar.xz" -C "$HOME" $(cd "$HOME" && ls -d .cache/flashinfer .cache/tvm-ffi .triton 2>/dev/null) 2>/dev/null
  [ "$(stat -c %s "$OUT/jit-cache.tar.xz" 2>/dev/null || echo 0)" -lt 16000000 ] || rm -f "$OUT/jit-cache.tar.xz"
fi
ls -la "$OUT"
