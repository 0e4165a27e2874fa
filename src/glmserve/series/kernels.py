"""The series' kernels: one source file each in `glmserve.kernels`, generated into every diff.

Each line's diff adds the kernels to SGLang as new modules (the shape of an upstream pull
request: a patched tree needs nothing else installed, and the lock hashes the kernel bytes that
run). Those added-file sections are never edited by hand: `python -m glmserve.series.regen`
renders them from the source files here, byte for byte as `git diff` writes a new file, and
`regen --check` (CI) fails when any diff's copy differs from its source.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from pathlib import Path

from glmserve.series.errors import PatchError

# The sources: src/glmserve/kernels/ (read as bytes: importing them needs torch and Triton).
KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels"
ATTENTION = "sglang/srt/layers/attention"
# Where a series adds each kernel (a path under site-packages) -> its source file.
KERNEL_FILES = {
    f"{ATTENTION}/fp8_kv_gather.py": "fp8_kv_gather.py",
    f"{ATTENTION}/fp8_mla_decode.py": "fp8_mla_decode.py",
}
_SECTION = re.compile(rb"^diff --git ", re.MULTILINE)  # a file's section starts a line


def kernel_source(rel: str, kernels_dir: Path | None = None) -> bytes:
    """The bytes a series adds at `rel` (one of KERNEL_FILES)."""
    path = (kernels_dir or KERNELS_DIR) / KERNEL_FILES[rel]
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PatchError(f"kernel source {path} unreadable: {exc.strerror}") from None


def added_file_section(rel: str, content: bytes) -> bytes:
    """`git diff --no-index --no-prefix a/sglang b/sglang`'s section for a new file at `rel`."""
    if not content:
        raise PatchError(f"kernel source for {rel} is empty")
    if not content.endswith(b"\n"):
        raise PatchError(f"kernel source for {rel} must end with a newline")
    blob = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()[:7]
    lines = content.splitlines(keepends=True)
    span = "1" if len(lines) == 1 else f"1,{len(lines)}"
    head = (
        f"diff --git b/{rel} b/{rel}\nnew file mode 100644\nindex 0000000..{blob}\n"
        f"--- /dev/null\n+++ b/{rel}\n@@ -0,0 +{span} @@\n"
    ).encode()
    return head + b"".join(b"+" + line for line in lines)


def _sections(patch: bytes) -> tuple[bytes, list[bytes]]:
    """(preamble, one chunk per file) of a git-style patch."""
    starts = [m.start() for m in _SECTION.finditer(patch)]
    if not starts:
        return patch, []
    bounds = [*starts, len(patch)]
    return patch[: starts[0]], [patch[a:b] for a, b in itertools.pairwise(bounds)]


def _section_path(section: bytes) -> str:
    header = section.split(b"\n", 1)[0].decode("utf-8", "replace")
    return header.split(" ")[-1].removeprefix("b/")


def generate(patch: bytes, kernels_dir: Path | None = None) -> bytes:
    """`patch` with each kernel's added-file section rendered from its source (idempotent)."""
    preamble, sections = _sections(patch)
    out = [preamble]
    for section in sections:
        rel = _section_path(section)
        out.append(
            added_file_section(rel, kernel_source(rel, kernels_dir))
            if rel in KERNEL_FILES
            else section
        )
    return b"".join(out)
