#!/usr/bin/env bash
# FA3's kernels for the SGLang 0.5.17 GPU proof (bench/device_run.sh lines): sgl-kernel 0.4.5's
# flash_ops.abi3.so (FlashAttention 3, what SGLang's fa3 backend calls), 1.1 GB, xz'd and split
# into parts of at most 60 MiB, one per device call (the carry limit is 64 MiB a call):
#
#   bench/fa3_kernels.sh [DIR]          (default .bundle/fa3: flash_ops.abi3.so.xz.part-NN + .sha256)
#
# On the warm device, carry each part in its own call (any command, e.g. `ls .bundle/fa3`): files
# carried earlier stay while the machine is held. The `lines` job then joins the parts, checks the
# sha256 and installs the library into the overlay's sgl_kernel/; without every part it runs the
# flashinfer phase alone and says so. The overlay (bench/bundle.sh --line 0.5.17) leaves the
# library out for the same reason the 0.5.12.post1 overlay does: its size.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(realpath -m "${1:-.bundle/fa3}")
version=0.4.5   # sglang 0.5.17's sglang-kernel pin (glmserve.sglang_lines)
cache=${WHEEL_CACHE:-.cache/bundle-0.5.17/wheels}
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
  | split -b 60M -d -a 2 - "$dir/flash_ops.abi3.so.xz.part-"
ls -la "$dir"
echo "fa3_kernels: $(ls "$dir"/flash_ops.abi3.so.xz.part-* | wc -l) parts; carry one per device call before 'bench/device_run.sh lines'"
