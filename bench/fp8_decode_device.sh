#!/bin/bash
# One device call for bench/fp8_decode.py on the H200 (run from the repository root there):
#   bash bench/fp8_decode_device.sh [fp8_decode.py args...]
# carry: .cache/e2e/e2e.tar.xz (bench/e2e/build_bundle.sh: SGLang 0.5.12.post1 with our series and
#   FlashInfer 0.6.11.post1) and, optionally, .cache/e2e/jit.tar.xz (FlashInfer/Triton JIT caches
#   that an earlier call returned). Writes fp8-decode.{json,md,png}, run.log and jit.tar.xz to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/fp8-decode-out}; mkdir -p "$OUT"
T0=$(date +%s)
mkdir -p /tmp/e2e && tar -xJf .cache/e2e/e2e.tar.xz -C /tmp/e2e || { echo "no bundle: run bench/e2e/build_bundle.sh" >&2; exit 2; }
JIT=${E2E_JIT:-.cache/e2e/jit.tar.xz}
if [ -f "$JIT" ]; then tar -xJf "$JIT" -C "$HOME" && echo "JIT cache restored from $JIT"; fi
export PYTHONPATH=/tmp/e2e/site MAX_JOBS=16 FLASHINFER_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
echo "unpacked in $(( $(date +%s) - T0 )) s; $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader)"
timeout -s TERM "${FP8_DECODE_HARD_S:-560}" python3 bench/fp8_decode.py --out "$OUT" "$@" 2>&1 | tee "$OUT/run.log"
rc=${PIPESTATUS[0]}
( cd "$HOME" && XZ_OPT="-T0 -3" timeout 40 tar -cJf /tmp/jit.tar.xz $(cd "$HOME" && ls -d .cache/flashinfer .cache/tvm-ffi .triton 2>/dev/null) ) \
  && [ "$(stat -c %s /tmp/jit.tar.xz)" -lt 16000000 ] && cp /tmp/jit.tar.xz "$OUT/jit.tar.xz"
ls -la "$OUT"; echo "total $(( $(date +%s) - T0 )) s, rc=$rc"
exit "$rc"
