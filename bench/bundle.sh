#!/usr/bin/env bash
# Build THE device bundle (bench/device_run.sh, both jobs, carries it): a PYTHONPATH overlay with
# the real SGLang wheel of the default line (glmserve.sglang_lines), its FlashInfer and
# apache-tvm-ffi for Python 3.12, built by ../shared/tools/sglang-device-bundle.sh.
#
#   usage: bench/bundle.sh [OUT.tar.xz]      (default .bundle/sglang-VERSION.tar.xz, the default line)
#          bench/bundle.sh --fleet [OUT]     (default .bundle/fleet.tar.xz; device_run.sh fleet)
#          bench/bundle.sh --line LINE [OUT]  (another line, e.g. the current one for the `lines`
#                                            job: default .bundle/sglang-LINE.tar.xz; recipe
#                                            bench/overlay.sh with the pins of
#                                            bench/overlay-pins/LINE.txt; FA3's kernels apart:
#                                            bench/fa3_kernels.sh)
#   (bench/e2e/build_bundle.sh is this script)
#
# --fleet adds what the fleet bench needs on the device (docs/fleet.md): the router (smg, whose
# `launch` needs only setproctitle of its dependencies) and our Locust suite's Python 3.12 stack,
# at their constraints.txt pins, and
# strips the debug sections of the large shared objects (strip --strip-debug: code, symbols and
# the dynamic table stay; xgrammar's 53 MB .so is 94 % DWARF) so it all fits one 64 MiB carry.
#
# The overlay is packed UNPATCHED on purpose: the device command applies the committed series
# with patches/apply.py, and takes glmserve, the profiles and the tiny models from the working
# tree it runs in, so the GPU runs exactly what is checked out, through the real tool.
# The overlay itself (~300 MB of pinned wheels that never change) is built once into
# .cache/bundle/site and rebuilt only when the overlay tool changes.
# Env: SGLANG_BUNDLE_TOOL (default /work/shared/tools/sglang-device-bundle.sh), WHEEL_CACHE, VENV.
set -euo pipefail
cd "$(dirname "$0")/.."
fleet=""
default=$(PYTHONPATH=src "${PYTHON:-python3}" -m glmserve.sglang_lines get version)
line=$default
if [ "${1:-}" = "--fleet" ]; then fleet=1; shift; fi
if [ "${1:-}" = "--line" ]; then line=${2:?bundle: --line needs an SGLang line}; shift 2; fi
out=$(realpath -m "${1:-$([ -n "$fleet" ] && echo .bundle/fleet.tar.xz || echo ".bundle/sglang-$line.tar.xz")}")
if [ "$line" = "$default" ]; then
  tool=${SGLANG_BUNDLE_TOOL:-/work/shared/tools/sglang-device-bundle.sh}
  [ -f "$tool" ] || { echo "bundle: $tool not found (set SGLANG_BUNDLE_TOOL)" >&2; exit 2; }
  work=.cache/bundle
  recipe=("$tool")
else
  [ -z "$fleet" ] || { echo "bundle: --fleet is for the default line's overlay" >&2; exit 2; }
  [ -f "bench/overlay-pins/$line.txt" ] || { echo "bundle: no overlay recipe for SGLang $line (bench/overlay-pins/)" >&2; exit 2; }
  tool=bench/overlay.sh
  work=.cache/bundle-$line
  recipe=(bench/overlay.sh "$line")
fi
site=$work/site
# names the overlay recipe: a changed tool (or pin list) rebuilds
if [ "$line" = "$default" ]; then
  stamp=$(sha256sum "$tool" | cut -c1-16)
else
  stamp=$(cat "$tool" "bench/overlay-pins/$line.txt" | sha256sum | cut -c1-16)
fi
if [ "$(cat "$work/stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -f "$work/stamp"; mkdir -p "$work"
  WHEEL_CACHE=${WHEEL_CACHE:-$work/wheels} VENV=${VENV:-$work/v312} bash "${recipe[@]}" "$site"
  echo "$stamp" >"$work/stamp"
fi
# FlashInfer JIT-compiles its MLA kernels there: the CUDA sources must be in the overlay.
for f in flashinfer/data/csrc/batch_mla_run.cu flashinfer/data/csrc/batch_mla_plan.cu \
         flashinfer/data/csrc/batch_mla_config.jinja flashinfer/data/include/flashinfer/attention/mla.cuh \
         sglang/srt/layers/attention/flashinfer_mla_backend.py sglang/srt/server_args.py; do
  [ -f "$site/$f" ] || { echo "bundle: $f missing from the overlay" >&2; exit 1; }
done
# Refuse a pre-patched tree: the device run must apply the series itself.
if [ -e "$site/sglang/srt/layers/attention/fp8_kv_gather.py" ] || [ -e "$site/sglang/.glmserve-patch.json" ]; then
  echo "bundle: the overlay in $site is already patched; delete $work and rebuild" >&2; exit 1
fi
find "$site" -name __pycache__ -type d -prune -exec rm -rf {} +
printf '{"overlay_tool_sha256_16": "%s", "built": "%s", "sglang_line": "%s"}\n' "$stamp" \
  "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$line" >"$site/.glmserve-bundle.json"
mkdir -p "$(dirname "$out")"
pack=$work
if [ -n "$fleet" ]; then
  command -v strip >/dev/null || { echo "bundle: --fleet needs strip (binutils)" >&2; exit 2; }
  pack=$work/fleet; rm -rf "$pack"; mkdir -p "$pack/wheels"; cp -a "$site" "$pack/site"
  pins=()
  for p in smg setproctitle locust gevent geventhttpclient greenlet zope.event zope.interface flask \
           flask-cors flask-login configargparse python-engineio python-socketio simple-websocket \
           wsproto bidict brotli blinker itsdangerous werkzeug; do
    pin=$(grep -i "^$p==" constraints.txt | head -n1)
    [ -n "$pin" ] || { echo "bundle: no pin for $p in constraints.txt" >&2; exit 2; }
    pins+=("$pin")
  done
  "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$pack/wheels" "${pins[@]}"
  for w in "$pack"/wheels/*.whl; do "${PYTHON:-python3}" -m zipfile -e "$w" "$pack/site"; done
  rm -rf "$pack/wheels"
  # --strip-unneeded drops the static symbol tables too (code unchanged, backtraces without
  # names): smg's .so is 4 MiB larger packed than sglang-router's was, and with --strip-debug
  # the bundle (63.5 MiB measured) no longer fit. FLEET_STRIP=--strip-debug keeps the names.
  find "$pack/site" -name '*.so' -size +1M -exec strip "${FLEET_STRIP:---strip-unneeded}" {} +
  printf '{"overlay_tool_sha256_16": "%s", "built": "%s", "fleet": "%s"}\n' "$stamp" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${pins[*]}" >"$pack/site/.glmserve-bundle.json"
fi
# The fleet bundle: the router and Locust have to fit beside the overlay. One thread and a 256 MiB
# dictionary find the repeats across the whole 300 MiB (61.0 -> 59.2 MiB measured with smg;
# about 5 minutes on 2 cores; the device needs ~260 MiB of memory to unpack it).
fleet_xz="-T1 --lzma2=preset=9e,dict=256MiB"
( cd "$pack" && XZ_OPT="${XZ_OPT:-$([ -n "$fleet" ] && echo "$fleet_xz" || echo "-T0 -6")}" tar -cJf "$out" site )
size=$(stat -c %s "$out")
echo "bundle: $out $((size / 1048576)) MiB"
# The device tool carries 64 MiB in all; a returned JIT cache (< 16 MiB) travels beside it.
limit=$([ -n "$fleet" ] && echo 62 || echo 60)  # the fleet bundle travels alone (no JIT cache)
[ "$size" -le $((limit * 1048576)) ] || { echo "bundle: over $limit MiB: it would not fit the carry limit" >&2; exit 1; }
[ "$size" -le $((48 * 1048576)) ] || echo "bundle: over 48 MiB: carry it without a JIT cache" >&2
