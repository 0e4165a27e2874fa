"""Apply, check and revert a series atomically, and keep the marker in step with the files.

The sequence for a change (apply or revert):
  1. detect the SGLang version and load its series (patch bytes verified against the lock);
  2. hash every target file and classify it as before-state, after-state, or drifted (refuse);
  3. build every new file content in memory with the strict applier, verify it against the
     lock's hashes and compile it, all before the tree is touched;
  4. write all new contents to temp files next to their targets, then swap them in with
     os.replace, the marker last; on any failure, swap the originals back;
  5. re-hash from disk and py_compile the touched modules (a failure here also rolls back).
"""

from __future__ import annotations

import contextlib
import json
import os
import py_compile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from glmserve.patching.detect import detect_version
from glmserve.patching.errors import PatchError
from glmserve.patching.series import (
    MARKER_REL,
    Series,
    load_series,
    read_optional,
    sha256_optional,
)
from glmserve.patching.udiff import apply_file_patch

NEW_FILE_MODE = 0o644


@dataclass
class Outcome:
    """What a run did (or, for a dry run, would do). `message` is the one line the CLI prints."""

    action: str  # "applied" | "reverted" | "already-applied" | "not-applied" | "marker-updated"
    version: str
    series: str
    message: str
    dry_run: bool = False
    changed: list[str] = field(default_factory=list)


def read_marker(site: str | Path) -> dict | None:
    """The marker the last successful apply wrote, or None if there is none (or it is unreadable)."""
    data = read_optional(Path(site) / MARKER_REL)
    if data is None:
        return None
    try:
        marker = json.loads(data)
    except ValueError:
        return None
    return marker if isinstance(marker, dict) else None


def build_marker(series: Series) -> dict:
    return {
        "series": series.source,
        "sglang_version": series.version,
        "lock_sha256": series.lock_sha256,
        "patches": series.patch_hashes,
        "files": {
            path: {"before": h.before, "after": h.after} for path, h in sorted(series.files.items())
        },
    }


def marker_bytes(marker: dict) -> bytes:
    return (json.dumps(marker, indent=2, sort_keys=True) + "\n").encode()


def _classify(site: Path, series: Series) -> dict[str, tuple[bytes | None, str]]:
    """{path: (current bytes, "before" | "after")}; raises on the first drifted file."""
    states: dict[str, tuple[bytes | None, str]] = {}
    for path, hashes in sorted(series.files.items()):
        current = read_optional(site / path)
        digest = sha256_optional(current)
        if digest == hashes.after:
            states[path] = (current, "after")
        elif digest == hashes.before:
            states[path] = (current, "before")
        else:
            shown = "absent" if digest is None else digest[:12]
            raise PatchError(
                f"drift: {path} (sha256 {shown}) matches neither the unpatched nor the patched "
                f"SGLang {series.version} file in the lock; refusing to touch {site}"
            )
    return states


def _transform(series: Series, path: str, content: bytes | None, reverse: bool) -> bytes | None:
    steps = series.file_patches()[path]
    if reverse:
        steps = [(name, fp.reversed()) for name, fp in reversed(steps)]
    for name, fp in steps:
        content = apply_file_patch(content, fp, name)
    hashes = series.files[path]
    want = hashes.before if reverse else hashes.after
    if sha256_optional(content) != want:
        raise PatchError(
            f"{path}: the series produces content that does not match the lock's "
            f"{'before' if reverse else 'after'}-hash; the lock is stale, run regen"
        )
    return content


def _syntax_check(path: str, content: bytes | None) -> None:
    if content is None or not path.endswith(".py"):
        return
    try:
        compile(content, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise PatchError(
            f"{path}: result does not compile: {exc.msg} (line {exc.lineno})"
        ) from None


def plan(site: Path, series: Series, reverse: bool) -> dict[str, bytes | None]:
    """New contents for every file that must change; nothing on disk is modified."""
    target_state = "before" if reverse else "after"
    changes: dict[str, bytes | None] = {}
    for path, (current, state) in _classify(site, series).items():
        if state == target_state:
            continue
        new = _transform(series, path, current, reverse)
        if new is not None and not (site / path).parent.is_dir():
            raise PatchError(f"{path}: its directory does not exist in {site}")
        _syntax_check(path, new)
        changes[path] = new
    return changes


# --- the transaction -------------------------------------------------------------------------


def _write_temp(target: Path, data: bytes, mode: int) -> Path:
    fd, name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".glmserve-tmp", dir=target.parent
    )
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(name, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    return Path(name)


def _replace(src: Path, dst: Path) -> None:
    """One swap step; a separate function so tests can inject a failure at a chosen file."""
    os.replace(src, dst)


def _unlink(path: Path) -> None:
    os.unlink(path)


def _py_compile(path: Path) -> None:
    py_compile.compile(str(path), doraise=True)


def _commit(site: Path, writes: dict[str, bytes | None]) -> None:
    """Make every write happen, or none: stage temps, swap, and roll back on any exception."""
    originals = {rel: read_optional(site / rel) for rel in writes}
    modes = {}
    for rel, old in originals.items():
        modes[rel] = (site / rel).stat().st_mode & 0o7777 if old is not None else NEW_FILE_MODE
    staged: dict[str, Path] = {}
    done: list[str] = []
    try:
        for rel, data in writes.items():
            if data is not None:
                staged[rel] = _write_temp(site / rel, data, modes[rel])
        for rel, data in writes.items():
            if data is None:
                if originals[rel] is not None:
                    _unlink(site / rel)
            else:
                _replace(staged[rel], site / rel)
                del staged[rel]  # only once it is in place: a failed swap leaves a temp to clean
            done.append(rel)
        for rel, data in writes.items():
            if sha256_optional(read_optional(site / rel)) != sha256_optional(data):
                raise PatchError(f"{rel}: content on disk differs from what was written")
            if data is not None and rel.endswith(".py"):
                _py_compile(site / rel)
    except BaseException as exc:
        failures = _rollback(site, done, originals, modes)
        for tmp in staged.values():
            with contextlib.suppress(OSError):
                tmp.unlink()
        if failures:
            raise PatchError(
                f"FAILED and could not roll back {', '.join(failures)}: reinstall SGLang ({exc})"
            ) from exc
        if isinstance(exc, PatchError):
            raise
        if isinstance(exc, py_compile.PyCompileError):
            raise PatchError(f"py_compile failed, rolled back: {exc.msg.strip()}") from exc
        if isinstance(exc, OSError):
            raise PatchError(f"write failed, rolled back: {exc}") from exc
        raise


def _rollback(
    site: Path, done: list[str], originals: dict[str, bytes | None], modes: dict[str, int]
) -> list[str]:
    failures = []
    for rel in reversed(done):
        target = site / rel
        try:
            old = originals[rel]
            if old is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(target)
            else:
                os.replace(_write_temp(target, old, modes[rel]), target)
        except OSError:
            failures.append(rel)
    return failures


def _drop_bytecode(site: Path, rel: str) -> None:
    """A deleted module's cached bytecode is dead weight; remove it (best effort)."""
    target = site / rel
    for pyc in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
        with contextlib.suppress(OSError):
            pyc.unlink()


# --- public operations -----------------------------------------------------------------------


def _resolve(site: str | Path, patches_dir: str | Path) -> tuple[Path, Series]:
    site = Path(site)
    if not site.is_dir():
        raise PatchError(f"target {site} is not a directory")
    version = detect_version(site)
    return site, load_series(Path(patches_dir), version)


def apply(site: str | Path, patches_dir: str | Path, *, dry_run: bool = False) -> Outcome:
    """Bring every target file to its patched state and write the marker (idempotent)."""
    site, series = _resolve(site, patches_dir)
    changes = plan(site, series, reverse=False)
    marker = build_marker(series)
    marker_ok = read_marker(site) == marker
    v, s = series.version, series.source
    if not changes and marker_ok:
        return Outcome("already-applied", v, s, f"SGLang {v}: series {s} already applied", dry_run)
    if not changes:
        if not dry_run:
            _commit(site, {MARKER_REL: marker_bytes(marker)})
        verb = "would rewrite" if dry_run else "rewrote"
        msg = f"SGLang {v}: files already patched with series {s}; {verb} the marker"
        return Outcome("marker-updated", v, s, msg, dry_run, [MARKER_REL])
    if dry_run:
        msg = f"SGLang {v}: series {s} applies cleanly to {len(changes)} file(s) (dry run, nothing changed)"
        return Outcome("applied", v, s, msg, True, sorted(changes))
    _commit(site, {**changes, MARKER_REL: marker_bytes(marker)})
    msg = f"SGLang {v}: applied series {s} to {len(changes)} file(s): {', '.join(sorted(changes))}"
    return Outcome("applied", v, s, msg, False, sorted(changes))


def check(site: str | Path, patches_dir: str | Path) -> Outcome:
    """Dry run of apply: every verification, no writes."""
    return apply(site, patches_dir, dry_run=True)


def revert(site: str | Path, patches_dir: str | Path, *, dry_run: bool = False) -> Outcome:
    """Restore every target file to its unpatched state (verified by hash) and drop the marker."""
    site, series = _resolve(site, patches_dir)
    changes = plan(site, series, reverse=True)
    has_marker = (site / MARKER_REL).exists()
    v, s = series.version, series.source
    if not changes and not has_marker:
        return Outcome("not-applied", v, s, f"SGLang {v}: series {s} is not applied", dry_run)
    writes: dict[str, bytes | None] = {**changes}
    if has_marker:
        writes[MARKER_REL] = None
    if dry_run:
        msg = f"SGLang {v}: series {s} reverts cleanly from {len(changes)} file(s) (dry run, nothing changed)"
        return Outcome("reverted", v, s, msg, True, sorted(writes))
    _commit(site, writes)
    for rel, data in changes.items():
        if data is None:
            _drop_bytecode(site, rel)
    msg = f"SGLang {v}: reverted series {s} from {len(changes)} file(s)"
    return Outcome("reverted", v, s, msg, False, sorted(writes))


__all__ = ["Outcome", "apply", "build_marker", "check", "read_marker", "revert"]
