#!/usr/bin/env bash
# FA3's kernels for the current line's GPU proof (bench/device_run.sh lines): the line's
# sglang-kernel flash_ops.abi3.so (FlashAttention 3, what SGLang's fa3 backend calls), 1.1 GB,
# xz'd and split into parts of 50 MiB, so that one part and the working tree fit one device call
# (64 MiB in all):
#
#   bench/fa3_kernels.sh [DIR]          (default .fa3parts: flash_ops.abi3.so.xz.part-NN + .sha256)
#
# DIR must be git-ignored (.git/info/exclude). A carried path is gone from the device at the next
# call that does not carry it, so each call moves its part out of the checkout, onto the warm
# machine: carry [DIR/part-NN (+ DIR/flash_ops.sha256 once)], command `mkdir -p /root/fa3 && mv
# DIR/* /root/fa3/`, one call per part, back to back (the machine is held 30 s after a call).
# Then `FA3_PARTS=/root/fa3 bash bench/device_run.sh lines` joins the parts, checks the sha256 and
# installs the library into the overlay's sgl_kernel/; without every part it runs the flashinfer
# phase alone and says so. The overlay (bench/bundle.sh --line LINE) leaves the library out for
# the same reason the default line's overlay does: its size.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(realpath -m "${1:-.fa3parts}")
line=$(PYTHONPATH=src "${PYTHON:-python3}" -m glmserve.sglang_lines get version current)
version=$(PYTHONPATH=src "${PYTHON:-python3}" -m glmserve.sglang_lines get sglang_kernel "$line")
cache=${WHEEL_CACHE:-.cache/bundle-$line/wheels}
mkdir -p "$cache" "$dir"
wheel=$(ls "$cache"/sglang_kernel-"$version"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi abi3 --abi cp312 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$cache" "sglang-kernel==$version"
  wheel=$(ls "$cache"/sglang_kernel-"$version"-*.whl | head -n1)
fi
work=$(mktemp -d /tmp/glmserve-fa3.XXXXXX)
trap 'rm -rf "$work"' EXIT
"${PYTHON:-python3}" - "$wheel" "$work" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as zf:
    zf.extract("sgl_kernel/flash_ops.abi3.so", sys.argv[2])
PY
( cd "$work/sgl_kernel" && sha256sum flash_ops.abi3.so ) >"$dir/flash_ops.sha256"
rm -f "$dir"/flash_ops.abi3.so.xz.part-*
XZ_OPT="${XZ_OPT:--T0 -6}" xz -c "$work/sgl_kernel/flash_ops.abi3.so" \
  | split -b 50M -d -a 2 - "$dir/flash_ops.abi3.so.xz.part-"
ls -la "$dir"
echo "fa3_kernels: $(ls "$dir"/flash_ops.abi3.so.xz.part-* | wc -l) parts in $dir; carry one per device call, each moved to /root/fa3 (header), before 'FA3_PARTS=/root/fa3 bash bench/device_run.sh lines'"
