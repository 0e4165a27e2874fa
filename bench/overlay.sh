#!/usr/bin/env bash
# The device overlay of an SGLang line other than the default one (whose recipe is
# ../shared/tools/sglang-device-bundle.sh): a PYTHONPATH overlay for the lent H200's python3
# (3.12, torch 2.11.0+cu130, triton 3.6.0, CUDA 13), from the pins in bench/overlay-pins/LINE.txt.
#
#   usage: bench/overlay.sh LINE SITE_DIR      (bench/bundle.sh --line LINE calls it)
#
# Same steps as the default line's recipe: download every pinned wheel for CPython 3.12, install
# them with --no-deps into SITE_DIR, unpack sglang-kernel without what this proof does not load
# or what cannot fit the 64 MiB carry (FlashAttention 3's flash_ops, 1.1 GB: bench/fa3_kernels.sh
# carries it in parts; the sm100/ kernels; FlashMLA; InfLLM; the CUDA headers), then trim
# sources nothing imports at run time.
# Needs: a Python 3.12 (python3.12 on PATH, or pyenv's 3.12.x; or PY312=...), pip with PyPI.
set -euo pipefail
[ $# -eq 2 ] || { sed -n 5p "$0" >&2; exit 2; }
line=$1; SITE=$(realpath -m "$2")
pins="$(dirname "$0")/overlay-pins/$line.txt"
[ -f "$pins" ] || { echo "overlay: no recipe for SGLang $line ($pins)" >&2; exit 2; }
if [ -z "${PY312:-}" ]; then
  for c in "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12.*/bin/python python3.12; do
    "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { PY312=$c; break; }
  done
fi
[ -n "${PY312:-}" ] || { echo "overlay: no Python 3.12 found (set PY312=/path/to/python3.12)" >&2; exit 2; }
VENV=${VENV:-/tmp/v312-overlay}
[ -x "$VENV/bin/pip" ] || "$PY312" -m venv "$VENV"
PIP="$VENV/bin/pip"
DL=${WHEEL_CACHE:-/tmp/glmserve-overlay-wheels}; mkdir -p "$DL"
rm -rf "$SITE"; mkdir -p "$SITE"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
 --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any"
mapfile -t PKGS < <(grep -v '^\s*#' "$pins" | grep -v '^\s*$')
kernel=""
for p in "${PKGS[@]}"; do
  n=${p%%==*}; v=${p##*==}; nn=$(echo "$n" | tr '-' '_')
  [ "$nn" = sglang_kernel ] && kernel=$v
  ls "$DL" | grep -qi "^${nn}-${v}-" && continue
  # shellcheck disable=SC2086  # PLAT: pip options, word-split on purpose
  "$PIP" download -q --no-deps $PLAT -d "$DL" "$p"
done
[ -n "$kernel" ] || { echo "overlay: $pins pins no sglang-kernel" >&2; exit 2; }
wheels=()
for p in "${PKGS[@]}"; do
  n=${p%%==*}; v=${p##*==}; nn=$(echo "$n" | tr '-' '_')
  [ "$nn" = sglang_kernel ] && continue
  w=$(ls "$DL" | grep -i "^${nn}-${v}-" | head -n1)
  wheels+=("$DL/$w")
done
"$PIP" install -q --no-deps --no-compile --no-cache-dir --target "$SITE" "${wheels[@]}"
"$PY312" - "$(ls "$DL"/sglang_kernel-"$kernel"-*.whl | head -n1)" "$SITE" <<'PY'
import fnmatch, sys, zipfile
skip = ["sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100/*", "sgl_kernel/flashmla_ops.abi3.so",
        "sgl_kernel/infllm_ops*", "lib/*", "lib64/*", "include/*", "_mscclpp*"]
with zipfile.ZipFile(sys.argv[1]) as zf:
    for name in zf.namelist():
        if not any(fnmatch.fnmatch(name, pat) for pat in skip):
            zf.extract(name, sys.argv[2])
PY
rm -f "$SITE"/xgrammar/lib/*.a
rm -rf "$SITE"/jedi/third_party/typeshed "$SITE"/jedi/third_party/django-stubs
rm -rf "$SITE"/flashinfer/data/cutlass/{examples,test,python,docs,media}
# The debug sections of the large shared objects (code, symbols and the dynamic table stay, as
# in the fleet bundle): xgrammar's .so alone is 53 MB, most of it DWARF.
command -v strip >/dev/null || { echo "overlay: strip (binutils) is needed" >&2; exit 2; }
find "$SITE" -name '*.so' -size +1M -exec strip --strip-debug {} +
find "$SITE" -name __pycache__ -type d -prune -exec rm -rf {} +
du -sh "$SITE"
