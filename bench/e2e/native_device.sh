#!/bin/bash
# The device call for bench/e2e/native.py (run from the repository root on the H200 machine):
#   bash bench/e2e/native_device.sh [native.py args...]
# carry: .cache/e2e/e2e.tar.xz (bench/e2e/build_bundle.sh) and optionally .cache/e2e/jit.tar.xz
# (FlashInfer/Triton JIT caches an earlier call returned). The working tree's glmserve runs
# (launcher, self-test, client); the bundle provides SGLang with our series and FlashInfer.
# Writes native-e2e.json/.md, run.log, logs.tar.xz and jit.tar.xz to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/native-e2e-out}; mkdir -p "$OUT"
T0=$(date +%s)
mkdir -p /tmp/e2e && tar -xJf .cache/e2e/e2e.tar.xz -C /tmp/e2e || { echo "no bundle: run bench/e2e/build_bundle.sh" >&2; exit 2; }
JIT=${E2E_JIT:-.cache/e2e/jit.tar.xz}
if [ -f "$JIT" ]; then tar -xJf "$JIT" -C "$HOME" && echo "JIT cache restored from $JIT"; fi
export PYTHONPATH=$PWD/src:/tmp/e2e/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MAX_JOBS=16 \
  FLASHINFER_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "unpacked in $(( $(date +%s) - T0 )) s; $(nvidia-smi -L | tr '\n' ' ')"
timeout -s TERM "${E2E_HARD_S:-520}" python3 bench/e2e/native.py --out "$OUT" --model-dir /tmp/e2e/models "$@" 2>&1 | tee "$OUT/run.log"
rc=${PIPESTATUS[0]}
cp /tmp/e2e/site/.e2e-bundle.json "$OUT/bundle.json" 2>/dev/null
( cd "$OUT" && tar -cJf logs.tar.xz $(ls -d logs buildinfo 2>/dev/null) && rm -rf logs buildinfo )
( cd "$HOME" && XZ_OPT="-T0 -3" timeout 40 tar -cJf /tmp/jit.tar.xz $(cd "$HOME" && ls -d .cache/flashinfer .cache/tvm-ffi .triton 2>/dev/null) ) \
  && [ "$(stat -c %s /tmp/jit.tar.xz)" -lt 16000000 ] && cp /tmp/jit.tar.xz "$OUT/jit.tar.xz"
ls -la "$OUT"; echo "native_device.sh total $(( $(date +%s) - T0 )) s, rc=$rc"
exit "$rc"
