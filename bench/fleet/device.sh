#!/bin/bash
# The whole fleet device call (run from the repository root on the H200 machine):
#   bash bench/fleet/device.sh [fleet_bench.py args...]
# carry: .cache/fleet/fleet.tar.xz (bench/fleet/build_bundle.sh builds it, < 62 MiB)
# Writes to $OUT: fleet.json, fleet.md, bench.log, logs.tar.xz (server logs, Locust reports,
# build info). Hard stop at FLEET_HARD_S (default 540 s) inside the tool's 600 s: the bench turns
# SIGTERM into an orderly stop that keeps every finished phase.
set -uo pipefail
OUT=${OUT:-/tmp/fleet-out}; mkdir -p "$OUT"
T0=$(date +%s)
# Servers of an earlier call killed at its time limit (same warm machine): stop their groups.
export FLEET_PGID_FILE=/tmp/fleet-server-pgids
if [ -f "$FLEET_PGID_FILE" ]; then
  while read -r g; do kill -TERM -- "-$g" 2>/dev/null; done < "$FLEET_PGID_FILE"; sleep 5
  while read -r g; do kill -KILL -- "-$g" 2>/dev/null; done < "$FLEET_PGID_FILE"; rm -f "$FLEET_PGID_FILE"
fi
mkdir -p /tmp/fleet && tar -xJf .cache/fleet/fleet.tar.xz -C /tmp/fleet \
  || { echo "no bundle: run bench/fleet/build_bundle.sh" >&2; exit 2; }
export PYTHONPATH=/tmp/fleet/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MAX_JOBS=16 \
  FLASHINFER_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
  FLEET_DEVICE="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n1)"
echo "unpacked in $(( $(date +%s) - T0 )) s; $FLEET_DEVICE"
timeout -s TERM "${FLEET_HARD_S:-540}" python3 bench/fleet/fleet_bench.py --mode device --out "$OUT" \
  --model-dir /tmp/fleet/models --profiles-dir /tmp/fleet/profiles "$@" 2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}
cp /tmp/fleet/site/.fleet-bundle.json "$OUT/bundle.json" 2>/dev/null
( cd "$OUT" && tar -cJf logs.tar.xz $(ls -d logs locust ./*.build-info.json 2>/dev/null) && rm -rf logs locust ./*.build-info.json )
ls -la "$OUT"; echo "device.sh total $(( $(date +%s) - T0 )) s, bench rc=$rc"
exit "$rc"
