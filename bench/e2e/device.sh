#!/bin/bash
# The whole device call (run from the repository root on the H200 machine):
#   bash bench/e2e/device.sh [harness args...]     e.g. --deadline-s 480
# carry: .cache/e2e/e2e.tar.xz (bench/e2e/build_bundle.sh builds it) and, optionally, a JIT cache
#   tarball named by E2E_JIT (default .cache/e2e/jit.tar.xz; FlashInfer/Triton caches under $HOME)
# Writes to $OUT (the tool fetches at most 8 files): e2e.json, e2e.md, harness.log, logs.tar.xz,
# and jit.tar.xz (FlashInfer/Triton JIT caches) for a later call to restore.
set -uo pipefail
OUT=${OUT:-/tmp/e2e-out}; mkdir -p "$OUT"
T0=$(date +%s)
# Servers of an earlier call that was killed at its time limit (same warm machine): stop their
# process groups by the ids that harness recorded, so ports and GPU memory are free again.
export E2E_PGID_FILE=/tmp/e2e-server-pgids
if [ -f "$E2E_PGID_FILE" ]; then
  while read -r g; do kill -TERM -- "-$g" 2>/dev/null; done < "$E2E_PGID_FILE"; sleep 5
  while read -r g; do kill -KILL -- "-$g" 2>/dev/null; done < "$E2E_PGID_FILE"; rm -f "$E2E_PGID_FILE"
fi
mkdir -p /tmp/e2e && tar -xJf .cache/e2e/e2e.tar.xz -C /tmp/e2e || { echo "no bundle: run bench/e2e/build_bundle.sh" >&2; exit 2; }
JIT=${E2E_JIT:-.cache/e2e/jit.tar.xz}
if [ -f "$JIT" ]; then tar -xJf "$JIT" -C "$HOME" && echo "JIT cache restored from $JIT"; fi
export PYTHONPATH=/tmp/e2e/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MAX_JOBS=16 \
  FLASHINFER_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "unpacked in $(( $(date +%s) - T0 )) s; $(nvidia-smi -L | tr '\n' ' ')"
# Hard stop well inside the tool's 600 s: the harness turns SIGTERM into an orderly stop + save.
timeout -s TERM "${E2E_HARD_S:-540}" python3 bench/e2e/harness.py --mode device --out "$OUT" --model-dir /tmp/e2e/models --profiles-dir /tmp/e2e/profiles "$@" 2>&1 | tee "$OUT/harness.log"
rc=${PIPESTATUS[0]}
cp /tmp/e2e/site/.e2e-bundle.json "$OUT/bundle.json" 2>/dev/null
( cd "$OUT" && tar -cJf logs.tar.xz $(ls -d logs buildinfo 2>/dev/null) && rm -rf logs buildinfo )
# JIT caches for the next call; only if they fit one returned file (16 MiB).
( cd "$HOME" && XZ_OPT="-T0 -3" timeout 40 tar -cJf /tmp/jit.tar.xz $(cd "$HOME" && ls -d .cache/flashinfer .cache/tvm-ffi .triton 2>/dev/null) ) \
  && [ "$(stat -c %s /tmp/jit.tar.xz)" -lt 16000000 ] && cp /tmp/jit.tar.xz "$OUT/jit.tar.xz"
ls -la "$OUT"; echo "device.sh total $(( $(date +%s) - T0 )) s, harness rc=$rc"
exit "$rc"
