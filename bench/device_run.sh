#!/usr/bin/env bash
# THE device command (one call on the lent H200, run from the repository root):
#
#   bash bench/device_run.sh [kernel] [ARGS]    GPU tests, self-test, bench/gather_cast.py ARGS
#   bash bench/device_run.sh correctness        the kernel job without the benchmark: self-test
#                                               (kernel + patched class) and tests/gpu, minutes
#   bash bench/device_run.sh e2e [ARGS]         real SGLang servers: bench/e2e/harness.py ARGS
#   bash bench/device_run.sh native [ARGS]      real SGLang servers: bench/e2e/native.py ARGS
#   bash bench/device_run.sh fp8-decode [ARGS]  kernels side by side: bench/fp8_decode.py ARGS
#   bash bench/device_run.sh verify [ARGS]      MTP: the self-test timing the verify pass (8 heads,
#                                               4 query tokens), tests/gpu, then the multi-token
#                                               kernel side by side: bench/fp8_verify.py ARGS
#   bash bench/device_run.sh smoke [ARGS]       the operator smoke test: python -m glmserve.smoke ARGS
#                                               (e.g. --profile tiny-mla --ready-timeout-s 240)
#   bash bench/device_run.sh lines [ARGS]       the current SGLang line (issue 20): upstream cast vs
#                                               patched vs BF16 KV on fa3 and flashinfer,
#                                               bench/e2e/lines.py ARGS (BUNDLE defaults to that
#                                               line's .bundle/sglang-LINE.tar.xz; fa3 needs the
#                                               kernels bench/fa3_kernels.sh splits, moved onto the
#                                               machine beforehand: FA3_PARTS, bench/README.md)
#   bash bench/device_run.sh fleet [ARGS]       two replicas behind SGLang's router, our Locust
#                                               through it: bench/fleet/fleet_bench.py ARGS
#                                               (BUNDLE=.bundle/fleet.tar.xz: bench/bundle.sh --fleet)
#   bash bench/device_run.sh accuracy [ARGS]    a model whose answers need the right KV rows (issue
#                                               31): builds the recall model
#                                               (bench/accuracy/recall_build.py), then task accuracy,
#                                               logprob agreement and MTP acceptance of every KV path
#                                               through real servers: accuracy_bench.py ARGS.
#   Aliases: bench/e2e/device.sh = e2e, bench/e2e/native_device.sh = native,
#            bench/fp8_decode_device.sh = fp8-decode.
#
# carry: .bundle/sglang-VERSION.tar.xz, VERSION the default line's (`python3 -m
# glmserve.sglang_lines get version`; bench/bundle.sh builds it: the UNPATCHED SGLang overlay) and, if you have one, .bundle/jit-cache.tar.xz (the JIT caches an earlier call returned).
# Both jobs share every other step: unpack the overlay, restore the JIT cache, apply the committed
# series with patches/apply.py (so the GPU runs exactly the diff in the working tree), check it,
# run the preflight, and ship the JIT cache back. glmserve comes from this working tree's src/.
# Everything lands in $OUT (at most 8 files come back): device.log (with a provenance line),
# jit-cache.tar.xz, plus the job's own files.
# Kernel job inputs: $KERNEL_VARIANTS/*.py, candidate kernels compared first (bitwise check +
# gather timings); the fastest correct one replaces the installed fp8_kv_gather.py for
# everything after, and comes back in $OUT so the series can ship exactly those bytes.
# GPU_TESTS (correctness/kernel jobs) narrows pytest to some of tests/gpu, e.g. the native files.
# DEVICE_DRY_RUN=1 prints the GPU commands instead of running them (the CPU tests use it);
# DEVICE_WORK (default /tmp/glmserve-device) is where the overlay is unpacked.
set -uo pipefail
: "${OUT:?OUT must name the folder that comes back}"
job=kernel
case "${1:-}" in kernel | correctness | verify | e2e | native | fp8-decode | smoke | fleet | lines | accuracy) job=$1; shift ;; esac
# The lines job runs the current line (glmserve.sglang_lines CURRENT_LINE), the rest the default.
line=$([ "$job" = lines ] && echo current || echo default)
BUNDLE=${BUNDLE:-.bundle/sglang-$(PYTHONPATH=$PWD/src python3 -m glmserve.sglang_lines get version "$line").tar.xz}
JIT_IN=${JIT_CACHE:-.bundle/jit-cache.tar.xz}
WORK=${DEVICE_WORK:-/tmp/glmserve-device}
SITE=$WORK/site
mkdir -p "$OUT"
log=$OUT/device.log
T0=$SECONDS
step() { echo "=== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }
# Servers of an earlier call killed at its time limit (same warm machine): stop their process
# groups by the ids the harness recorded, so ports and GPU memory are free again.
stop_leftover_servers() {
  export E2E_PGID_FILE=${E2E_PGID_FILE:-/tmp/e2e-server-pgids}
  if [ -f "$E2E_PGID_FILE" ]; then
    while read -r g; do kill -TERM -- "-$g" 2>/dev/null; done <"$E2E_PGID_FILE"
    sleep "${E2E_KILL_GRACE_S:-5}"
    while read -r g; do kill -KILL -- "-$g" 2>/dev/null; done <"$E2E_PGID_FILE"
    rm -f "$E2E_PGID_FILE"
  fi
}
gpu() {  # a command that needs the GPU
  if [ -n "${DEVICE_DRY_RUN:-}" ]; then echo "dry-run: $*"; else "$@"; fi
}

step "job $job"
[ -f "$BUNDLE" ] || { echo "device_run: no bundle $BUNDLE: run bench/bundle.sh and carry it" | tee -a "$log" >&2; exit 2; }
rm -rf "$WORK" && mkdir -p "$WORK" && tar -xJf "$BUNDLE" -C "$WORK" || exit 2
[ -d "$SITE/sglang" ] || { echo "device_run: $BUNDLE holds no site/sglang" | tee -a "$log" >&2; exit 2; }
# src/ first: the working tree's glmserve wins over any copy inside an overlay.
export PYTHONPATH=$PWD/src:$SITE HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MAX_JOBS=16 \
  FLASHINFER_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -f "$JIT_IN" ]; then tar -xJf "$JIT_IN" -C "$HOME" && step "restored JIT cache $JIT_IN"; fi
if [ "$job" = lines ]; then
  # FA3's kernels (sgl-kernel's flash_ops, 1.1 GB: in the overlay they would not fit one carry)
  # come in parts that earlier calls moved onto this warm machine (bench/fa3_kernels.sh); without
  # all of them the fa3 phase is left out and said so.
  FA3_PARTS=${FA3_PARTS:-/root/fa3}
  if [ -f "$FA3_PARTS/flash_ops.sha256" ] && ls "$FA3_PARTS"/flash_ops.abi3.so.xz.part-* >/dev/null 2>&1; then
    manifest=$(realpath "$FA3_PARTS/flash_ops.sha256")
    cat "$FA3_PARTS"/flash_ops.abi3.so.xz.part-* | xz -dc >"$SITE/sgl_kernel/flash_ops.abi3.so" \
      && (cd "$SITE/sgl_kernel" && sha256sum -c "$manifest") 2>&1 | tee -a "$log" \
      && step "fa3 kernels installed from $FA3_PARTS" \
      || { rm -f "$SITE/sgl_kernel/flash_ops.abi3.so"; step "fa3 kernels in $FA3_PARTS are incomplete: fa3 phase left out"; }
  else
    step "no fa3 kernels in $FA3_PARTS (bench/fa3_kernels.sh): fa3 phase left out"
  fi
  if [ ! -f "$SITE/sgl_kernel/flash_ops.abi3.so" ]; then set -- --backends flashinfer "$@"; fi
fi
step "device"
gpu nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1 | tee -a "$log"
step "apply series"
python3 patches/apply.py --target "$SITE" 2>&1 | tee -a "$log"
python3 patches/apply.py --target "$SITE" --check 2>&1 | tee -a "$log"
python3 -m glmserve.preflight --target "$SITE" 2>&1 | tee -a "$log"
# What ran, as one line of the log: the overlay's build stamp, the marker the series left, the
# hash of the code this call ran (src, patches, deploy, bench scripts) and the commit if known.
python3 - "$SITE" <<'PY' 2>&1 | tee -a "$log"
import hashlib, json, pathlib, subprocess, sys
site = pathlib.Path(sys.argv[1])
def read(p):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
tree = hashlib.sha256()
for p in sorted(f for d in ("src", "patches", "deploy", "bench") for f in pathlib.Path(d).rglob("*")):
    if p.is_file() and not {"__pycache__", "results"} & set(p.parts):
        tree.update(str(p).encode() + b"\0" + p.read_bytes())
git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
marker = read(site / "sglang" / ".glmserve-patch.json") or {}
print("provenance: " + json.dumps({
    "bundle": read(site / ".glmserve-bundle.json"),
    "series": marker.get("series"), "lock_sha256": marker.get("lock_sha256"),
    "tree_sha256": tree.hexdigest(), "git_head": git.stdout.strip() or None,
}, sort_keys=True))
PY

rc=0
case $job in
verify)
  # The kernel comparison first (it also JIT-builds what the checks need), then the self-test
  # as the launcher runs it for GLM-5 at TP8 (8 heads per rank) under the MTP profiles (4 query
  # tokens per verify pass), then tests/gpu: each under its own hard stop inside the call.
  step "bench/fp8_verify.py"
  gpu timeout -s TERM "${VERIFY_HARD_S:-240}" python3 bench/fp8_verify.py --out "$OUT" "$@" 2>&1 \
    | tee "$OUT/verify.log" | tail -60
  rc=${PIPESTATUS[0]}
  step "self-test (8 heads, decode batches 1 and 64, verify 4 tokens)"; t0=$SECONDS
  GLMSERVE_SELFTEST_HEADS=8 GLMSERVE_SELFTEST_DECODE_BATCHES=1,64 GLMSERVE_SELFTEST_VERIFY_TOKENS=4 \
    gpu timeout -s TERM "${SELFTEST_HARD_S:-150}" python3 -m glmserve.selftest 2>&1 | tee -a "$log"
  echo "rc=${PIPESTATUS[0]} wall=$((SECONDS - t0)) s" | tee -a "$log"
  step "GPU tests"
  # shellcheck disable=SC2086  # GPU_TESTS: test paths, space-separated (default: all of tests/gpu)
  gpu timeout -s TERM "${GPU_TESTS_HARD_S:-200}" python3 -m pytest -v -s -rA -p no:cacheprovider \
    ${GPU_TESTS:-tests/gpu} 2>&1 | tee "$OUT/gpu-tests.log" \
    | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|^dry-run" | tee -a "$log"
  ;;
kernel | correctness)
  KERNEL=$SITE/sglang/srt/layers/attention/fp8_kv_gather.py
  if [ -n "${KERNEL_VARIANTS:-}" ]; then
    step "kernel variants"
    gpu python3 bench/gather_cast.py --out "$OUT" --no-fp8-native --variants "$KERNEL_VARIANTS"/*.py \
      --write-best "$KERNEL" 2>&1 | grep -E "^installed|ceiling|Error|error|^dry-run" | tee -a "$log"
    cp "$KERNEL" "$OUT/fp8_kv_gather.py"; sha256sum "$KERNEL" | tee -a "$log"
  fi
  step "self-test"; t0=$SECONDS
  gpu python3 -m glmserve.selftest 2>&1 | tee -a "$log"
  echo "rc=${PIPESTATUS[0]} wall=$((SECONDS - t0)) s" | tee -a "$log"
  step "GPU tests"
  # shellcheck disable=SC2086  # GPU_TESTS: test paths, space-separated (default: all of tests/gpu)
  gpu python3 -m pytest -v -s -rA -p no:cacheprovider ${GPU_TESTS:-tests/gpu} 2>&1 | tee "$OUT/gpu-tests.log" \
    | grep -E "PASSED|FAILED|ERROR|SKIPPED|^\[|passed|failed|^dry-run" | tee -a "$log"
  if [ "$job" = kernel ]; then
    step "benchmark"
    gpu python3 bench/gather_cast.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -45
  fi
  ;;
accuracy)
  # The whole job ends by ACCURACY_END_S (default 500 s) after its start, inside the 9 minutes
  # with the JIT cache still to pack: the recall model is built (a second, the same bytes on
  # every machine), then the bench runs under whatever is left, saving after every phase.
  model=$WORK/recall-mla
  step "plan (s): setup done at $((SECONDS - T0)); build the model ~5;" \
    "12 servers start ~75 (warm JIT; cold ~200); 2k/8k/32k contexts ~60; stop ~15;" \
    "everything by ${ACCURACY_END_S:-500}, then logs + JIT cache ~30"
  gpu python3 bench/accuracy/recall_build.py --out "$model" 2>&1 | tee "$OUT/build.log"
  stop_leftover_servers
  if [ -f "$model/model.safetensors" ] || [ -n "${DEVICE_DRY_RUN:-}" ]; then
    hard=$(( ${ACCURACY_END_S:-500} - (SECONDS - T0) ))
    step "bench/accuracy/accuracy_bench.py (hard stop ${hard} s)"
    gpu timeout -s TERM "$hard" python3 bench/accuracy/accuracy_bench.py --out "$OUT" --model "$model" \
      --site "$SITE" --work "$WORK/accuracy" --deadline-s $(( hard - 45 )) "$@" 2>&1 | tee "$OUT/run.log"
    rc=${PIPESTATUS[0]}
  fi
  ( cd "$OUT" && logs=$(ls -d logs buildinfo 2>/dev/null) && [ -n "$logs" ] \
    && tar -cJf logs.tar.xz $logs && rm -rf $logs )
  ;;
e2e | native | fp8-decode | smoke | fleet | lines)
  # One Python script under a hard stop well inside the tool's 600 s: the scripts turn SIGTERM
  # into an orderly stop + save.
  case $job in
    e2e) script=(bench/e2e/harness.py --mode device); tee_to=harness.log; hard=${E2E_HARD_S:-540} ;;
    native) script=(bench/e2e/native.py); tee_to=run.log; hard=${E2E_HARD_S:-520} ;;
    fp8-decode) script=(bench/fp8_decode.py); tee_to=run.log; hard=${FP8_DECODE_HARD_S:-560} ;;
    # One server at a time through the launcher, on a profile of the working tree (the tiny
    # profiles find their model next to them); its logs/ and buildinfo/ are packed below.
    smoke) script=(-m glmserve.smoke); tee_to=smoke.log; hard=${SMOKE_HARD_S:-560} ;;
    fleet) script=(bench/fleet/fleet_bench.py --mode device); tee_to=bench.log; hard=${FLEET_HARD_S:-540} ;;
    lines) script=(bench/e2e/lines.py); tee_to=run.log; hard=${E2E_HARD_S:-540} ;;
  esac
  if [ "$job" = e2e ] || [ "$job" = native ] || [ "$job" = fleet ] || [ "$job" = lines ]; then
    stop_leftover_servers
  fi
  step "${script[0]}"
  gpu timeout -s TERM "$hard" python3 "${script[@]}" --out "$OUT" "$@" 2>&1 | tee "$OUT/$tee_to"
  rc=${PIPESTATUS[0]}
  # Every server's log and build info, in one returned file.
  ( cd "$OUT" && logs=$(ls -d logs buildinfo 2>/dev/null) && [ -n "$logs" ] \
    && tar -cJf logs.tar.xz $logs && rm -rf $logs )
  ;;
esac

step "done"
# The JIT caches for the next call, only if they fit one returned file (16 MiB); not after a
# variants run, whose two extra files already fill the 8 that come back.
if [ -z "${KERNEL_VARIANTS:-}" ]; then
  caches=$(cd "$HOME" && ls -d .cache/flashinfer .cache/tvm-ffi .triton 2>/dev/null)
  if [ -n "$caches" ]; then
    ( cd "$HOME" && XZ_OPT="-T0 -3" timeout 60 tar -cJf "$OUT/jit-cache.tar.xz" $caches )
    # Too large with Triton's cache (kernel variants): FlashInfer's, the slow one to rebuild.
    if [ "$(stat -c %s "$OUT/jit-cache.tar.xz" 2>/dev/null || echo 0)" -ge 16000000 ]; then
      caches=$(cd "$HOME" && ls -d .cache/flashinfer .cache/tvm-ffi 2>/dev/null)
      ( cd "$HOME" && XZ_OPT="-T0 -3" timeout 60 tar -cJf "$OUT/jit-cache.tar.xz" $caches )
    fi
    [ "$(stat -c %s "$OUT/jit-cache.tar.xz" 2>/dev/null || echo 0)" -lt 16000000 ] || rm -f "$OUT/jit-cache.tar.xz"
  fi
fi
ls -la "$OUT" | tee -a "$log"
echo "device_run $job: $((SECONDS - T0)) s, rc=$rc" | tee -a "$log"
exit "$rc"
