"""Edit the patch as real files, then regenerate the diff from them (never edit hunks or sed).

    python -m glmserve.series.workspace open DIR   # DIR/a: pristine wheel files, DIR/b: patched
    ...edit the files under DIR/b/sglang/ (and run what you can on them)...
    python -m glmserve.series.workspace diff DIR   # git diff a/ b/ -> patches/<source>/0001-*.patch
    python -m glmserve.series.regen                # re-verify every version's wheel, rewrite the lock

`open` extracts every file the source series touches from the wheel the source was made against
(the source directory's name is that SGLang version) into `a/`, and the same files with the
current series applied by the real apply tool into `b/`, so `b/` is byte for byte what ships.
The kernels the series adds (glmserve.series.kernels) are not edited here: `diff` writes b/'s
copies from their one source, src/glmserve/kernels/, and refuses a copy edited in b/.
`diff` writes `git diff --no-index --no-prefix a/sglang b/sglang` (git's configuration ignored,
so every machine writes the same bytes) under the old patch's preamble, after checking that the
strict applier turns `a/` into exactly `b/` with it. With no edit, `diff` reproduces the committed
patch byte for byte (tested), so the diff in `patches/` is provably the diff of real files.

    python -m glmserve.series.workspace open DIR --new X.Y.Z --from SOURCE [--add-file PATH]

starts a source series for a newer release: `a/` and `b/` hold that release's pristine files (every
file SOURCE touches, plus each `--add-file`), and `b/` also gets SOURCE's new modules as they
ship; `diff` then writes `patches/X.Y.Z/`'s first patch under SOURCE's preamble (edit its text in
the patch file). `--add-file` on an existing series brings one more target file into the area.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from glmserve.series.engine import apply
from glmserve.series.errors import PatchError
from glmserve.series.kernels import KERNEL_FILES, kernel_source
from glmserve.series.lock import (
    MARKER_REL,
    default_patches_dir,
    load_series,
    read_optional,
    sha256_optional,
)
from glmserve.series.regen import read_sources
from glmserve.series.udiff import apply_file_patch, parse_patch
from glmserve.series.wheels import default_cache_dir, extract_site, fetch_wheel

STATE_NAME = ".glmserve-workspace.json"
DIFF_START = b"diff --git "
# Deterministic git output whatever the user's config says (prefixes, renames, colour, algorithm).
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}
GIT_DIFF = (
    "git",
    "diff",
    "--no-index",
    "--no-prefix",
    "--no-color",
    "--no-renames",
    "--no-ext-diff",
    "--no-textconv",
    "--diff-algorithm=myers",
)


def open_workspace(
    workdir: Path,
    patches_dir: Path,
    source: str,
    cache_dir: Path | None = None,
    *,
    download: bool = True,
    new_from: str | None = None,
    add_files: tuple[str, ...] = (),
) -> Path:
    """Create `workdir` with a/ (pristine) and b/ (series applied); refuses a non-empty one.

    `new_from`: start the new source series `source` from that source's edits (see the module
    text); `add_files`: more pristine files (paths under site-packages) in both a/ and b/."""
    if workdir.exists() and any(workdir.iterdir()):
        raise PatchError(f"{workdir} exists and is not empty; pick a new directory")
    if new_from is not None:
        return _open_new(workdir, patches_dir, source, new_from, cache_dir, download, add_files)
    series = load_series(patches_dir, source)
    if series.source != source:
        raise PatchError(f"{source} is not a source series (it uses {series.source})")
    wheel = fetch_wheel(source, cache_dir or default_cache_dir(), download=download)
    existing = sorted(p for p, h in series.files.items() if h.before is not None)
    extra = sorted(set(add_files) - set(series.files))
    for side in ("a", "b"):
        extract_site(wheel, workdir / side, [*existing, *extra])
    apply(workdir / "b", patches_dir)
    (workdir / "b" / MARKER_REL).unlink()  # apply's bookkeeping, not part of the diff
    _drop_bytecode(workdir)
    state = {
        "source": source,
        "patches": [name for name, _ in series.patches],
        "kernels": _kernel_hashes(workdir / "b"),
    }
    (workdir / STATE_NAME).write_text(json.dumps(state, indent=2) + "\n")
    return workdir


def _kernel_hashes(tree: Path) -> dict[str, str | None]:
    """sha256 of each generated kernel file in `tree` (None: absent), as `open` left them."""
    return {rel: sha256_optional(read_optional(tree / rel)) for rel in sorted(KERNEL_FILES)}


def _refresh_kernels(workdir: Path, opened: dict[str, str | None]) -> None:
    """b/'s kernel copies become their sources; a copy edited in b/ is refused (it would be lost).

    The kernels are generated into every line's diff from src/glmserve/kernels/, so a work area
    edits the wiring only; `opened` is what `open` put there (a newer source replaces it)."""
    for rel in sorted(KERNEL_FILES):
        target = workdir / "b" / rel
        current = read_optional(target)
        if current is None:
            continue
        source = kernel_source(rel)
        if current == source:
            continue
        if sha256_optional(current) != opened.get(rel):
            raise PatchError(
                f"{target} was edited; the kernels have one source: edit "
                f"src/glmserve/kernels/{KERNEL_FILES[rel]} (regen writes it into every line's diff)"
            )
        target.write_bytes(source)


def _open_new(
    workdir: Path,
    patches_dir: Path,
    source: str,
    new_from: str,
    cache_dir: Path | None,
    download: bool,
    add_files: tuple[str, ...],
) -> Path:
    """a/ and b/ from the `source` wheel, b/ with `new_from`'s new modules, for a new series."""
    if (patches_dir / source).is_dir() and any((patches_dir / source).glob("*.patch")):
        raise PatchError(f"series {source} already exists; open it without --new")
    base = load_series(patches_dir, new_from)
    if base.source != new_from:
        raise PatchError(f"{new_from} is not a source series (it uses {base.source})")
    wheel = fetch_wheel(source, cache_dir or default_cache_dir(), download=download)
    existing = sorted(p for p, h in base.files.items() if h.before is not None)
    for side in ("a", "b"):
        extract_site(wheel, workdir / side, sorted({*existing, *add_files}))
    for path, steps in sorted(base.file_patches().items()):
        if base.files[path].before is not None:
            continue  # a file of the release itself: its edits are ported by hand in b/
        content = None
        for name, fp in steps:
            content = apply_file_patch(content, fp, f"{new_from}/{name}")
        if content is not None:
            (workdir / "b" / path).parent.mkdir(parents=True, exist_ok=True)
            (workdir / "b" / path).write_bytes(content)
    names = [name for name, _ in base.patches]
    if len(names) != 1:
        raise PatchError(f"series {new_from} has {len(names)} patches; start from a one-patch one")
    state = {
        "source": source,
        "patches": names,
        "preamble_from": new_from,
        "kernels": _kernel_hashes(workdir / "b"),
    }
    (workdir / STATE_NAME).write_text(json.dumps(state, indent=2) + "\n")
    return workdir


def _drop_bytecode(workdir: Path) -> None:
    """Bytecode (apply's, or from trying the edited files) would become binary hunks."""
    for side in ("a", "b"):
        for cache in sorted((workdir / side).rglob("__pycache__")):
            shutil.rmtree(cache)


def _git_diff(workdir: Path) -> bytes:
    _drop_bytecode(workdir)
    try:
        proc = subprocess.run(
            [*GIT_DIFF, "a/sglang", "b/sglang"],
            cwd=workdir,
            capture_output=True,
            env={**os.environ, **GIT_ENV},
            timeout=120,
        )
    except FileNotFoundError:
        raise PatchError("git is needed to write the diff (git diff --no-index)") from None
    if proc.returncode not in (0, 1):  # 1 means "the trees differ", the usual case
        tail = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise PatchError(f"git diff failed: {tail}")
    return proc.stdout


def workspace_diff(workdir: Path, patches_dir: Path) -> tuple[Path, bool]:
    """Write the diff of `workdir` into its source series; (patch path, whether it changed)."""
    try:
        state = json.loads((workdir / STATE_NAME).read_text())
        source, names = str(state["source"]), list(state["patches"])
        preamble_from = state.get("preamble_from")
        opened_kernels = dict(state.get("kernels", {}))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise PatchError(f"{workdir} is not a work area made by `open`") from None
    if len(names) != 1:
        raise PatchError(
            f"series {source} has {len(names)} patches; a work area diff is one patch, "
            "so split the edits by hand into their own work areas"
        )
    target = patches_dir / source / names[0]
    old = read_optional(target)
    # A new series' first diff borrows its preamble from the series it started from.
    template = (
        old if old is not None else read_optional(patches_dir / str(preamble_from) / names[0])
    )
    if template is None:
        raise PatchError(f"{target} does not exist")
    _refresh_kernels(workdir, opened_kernels)
    body = _git_diff(workdir)
    if not body:
        raise PatchError(f"a/ and b/ in {workdir} are identical: the patch would be empty")
    new = template[: template.index(DIFF_START)] if DIFF_START in template else b""
    new += body
    # The strict applier must turn every a/ file into its b/ file with exactly these bytes.
    for fp in parse_patch(new, target.name):
        before = read_optional(workdir / "a" / fp.path)
        result = apply_file_patch(before, fp, target.name)
        if result != read_optional(workdir / "b" / fp.path):
            raise PatchError(f"{fp.path}: the diff does not reproduce b/ (report this)")
    changed = new != old
    if changed:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(new)
    return target, changed


def main(argv: list[str] | None = None) -> int:
    prog = "python -m glmserve.series.workspace"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    op = sub.add_parser("open", help="make DIR/a (pristine) and DIR/b (the series applied)")
    op.add_argument("dir", type=Path)
    op.add_argument("--series", default=None, help="source series (default: the only one)")
    op.add_argument("--wheels", type=Path, default=None, help="wheel cache (.cache/wheels)")
    op.add_argument("--offline", action="store_true", help="never download the wheel")
    op.add_argument(
        "--new", metavar="VERSION", default=None, help="start a new source series for VERSION"
    )
    op.add_argument(
        "--from",
        dest="new_from",
        metavar="SOURCE",
        default=None,
        help="with --new: the source series whose edits are ported (its new modules go into b/)",
    )
    op.add_argument(
        "--add-file",
        action="append",
        default=[],
        metavar="PATH",
        help="one more pristine file into a/ and b/ (a path under site-packages, e.g. "
        "sglang/srt/layers/attention/flashattention_backend.py); repeatable",
    )
    df = sub.add_parser("diff", help="write git diff a/ b/ into the source series' patch")
    df.add_argument("dir", type=Path)
    for p in (op, df):
        p.add_argument("--patches", type=Path, default=None, help="default: this checkout's")
    args = parser.parse_args(argv)
    patches_dir = args.patches or default_patches_dir()
    if patches_dir is None or not patches_dir.is_dir():
        print(f"{prog}: error: no patch series directory; pass --patches", file=sys.stderr)
        return 2
    try:
        if args.command == "open":
            if (args.new is None) != (args.new_from is None):
                raise PatchError("--new and --from go together")
            source = args.new or args.series or _only_source(patches_dir)
            open_workspace(
                args.dir,
                patches_dir,
                source,
                args.wheels,
                download=not args.offline,
                new_from=args.new_from,
                add_files=tuple(args.add_file),
            )
            print(f"{prog}: {args.dir}/a pristine SGLang {source}, {args.dir}/b patched; edit b/")
        else:
            target, changed = workspace_diff(args.dir, patches_dir)
            if not changed:
                print(f"{prog}: {target} is unchanged")
            else:
                print(f"{prog}: wrote {target}; now run python -m glmserve.series.regen")
    except PatchError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _only_source(patches_dir: Path) -> str:
    sources = sorted(set(read_sources(patches_dir).values()))
    if len(sources) != 1:
        raise PatchError(f"several source series ({', '.join(sources)}); pass --series")
    return sources[0]


if __name__ == "__main__":
    sys.exit(main())
