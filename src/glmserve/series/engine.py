"""Apply, check and revert a series atomically, and keep the marker in step with the files.

The sequence for a change (apply or revert):
  1. detect the SGLang version and load its series (patch bytes verified against the lock);
  2. hash every target file and classify it as before-state, after-state, or drifted (refuse);
  3. build every new file content in memory with the strict applier, verify it against the
     lock's hashes and compile it, all before the tree is touched;
  4. write the journal (what is about to change), then all new contents to temp files next to
     their targets, then swap them in with os.replace, the marker last; on any failure, swap the
     originals back and drop the touched modules' bytecode;
  5. re-hash from disk and py_compile the touched modules (a failure here also rolls back);
  6. remove the journal.

Each swap is atomic, but a process killed between two of them (kill -9, power loss) leaves some
files patched and some not. The journal, written before the first temp file, is what says so
afterwards: while it exists the tree is half-applied, whatever the files look like. `check`
refuses such a tree in one line, the launcher and the build's preflight refuse it, and the next
`apply` or `revert` heals it (every file to one state, leftover temp files removed).
A tree with mixed files and no journal (left by an older tool, or edited by hand) is refused
and healed the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import py_compile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from glmserve.series.detect import detect_version
from glmserve.series.errors import PatchError
from glmserve.series.lock import (
    MARKER_REL,
    Series,
    load_series,
    read_optional,
    sha256_optional,
)
from glmserve.series.udiff import apply_file_patch

NEW_FILE_MODE = 0o644
JOURNAL_REL = "sglang/.glmserve-patch.journal.json"
TEMP_SUFFIX = ".glmserve-tmp"

# Test hook: GLMSERVE_PATCH_KILL_AT=N sends SIGKILL to this process at the N-th step boundary of
# a change (1-based), so the tests can crash a real run between every pair of steps.
KILL_AT_ENV = "GLMSERVE_PATCH_KILL_AT"
_steps_taken = 0


def _step() -> None:
    global _steps_taken
    _steps_taken += 1
    raw = os.environ.get(KILL_AT_ENV)
    if raw and raw.isdigit() and int(raw) == _steps_taken:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


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


def _temp_path(target: Path) -> Path:
    # One fixed name per target (not mkstemp's random one), so a crashed run's temp file is
    # found and removed by the next run instead of piling up.
    return target.parent / f".{target.name}{TEMP_SUFFIX}"


def _write_temp(target: Path, data: bytes, mode: int) -> Path:
    name = _temp_path(target)
    # O_EXCL: a temp that exists here belongs to a concurrent run (a crashed one's was removed).
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
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
    return name


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def leftover_temps(site: Path, rels: Iterable[str]) -> list[Path]:
    """Temp files of earlier runs beside these targets (also mkstemp-named ones of older tools)."""
    found: set[Path] = set()
    for rel in rels:
        target = site / rel
        if target.parent.is_dir():
            found.update(target.parent.glob(f".{target.name}.*{TEMP_SUFFIX}"))
            found.update(target.parent.glob(f".{target.name}{TEMP_SUFFIX}"))
    return sorted(found)


def read_journal(site: str | Path) -> dict | None:
    """The journal of an interrupted change, or None. An unreadable one still means interrupted."""
    data = read_optional(Path(site) / JOURNAL_REL)
    if data is None:
        return None
    try:
        journal = json.loads(data)
    except ValueError:
        journal = None
    return journal if isinstance(journal, dict) else {"operation": "unknown", "files": []}


def _write_journal(site: Path, operation: str, series: Series, rels: list[str]) -> None:
    journal = {
        "operation": operation,
        "series": series.source,
        "sglang_version": series.version,
        "files": rels,
    }
    target = site / JOURNAL_REL
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_temp_path(target))
    tmp = _write_temp(target, marker_bytes(journal), NEW_FILE_MODE)
    os.replace(tmp, target)
    _fsync_dir(target.parent)  # the journal is durable before the first file changes


def _remove_journal(site: Path) -> None:
    target = site / JOURNAL_REL
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target)
    _fsync_dir(target.parent)


def interrupted(site: str | Path) -> str | None:
    """One line when an apply or revert was interrupted here (the journal exists), else None:
    what the launcher and the build's preflight refuse, whatever the files look like."""
    journal = read_journal(site)
    if journal is None:
        return None
    op = journal.get("operation", "unknown")
    return (
        f"an interrupted {op} left {Path(site) / 'sglang'} half-applied ({JOURNAL_REL} exists); "
        f"heal it with: python3 patches/apply.py --target {site} (or --revert)"
    )


def _replace(src: Path, dst: Path) -> None:
    """One swap step; a separate function so tests can inject a failure at a chosen file."""
    os.replace(src, dst)


def _unlink(path: Path) -> None:
    os.unlink(path)


def _py_compile(path: Path) -> None:
    py_compile.compile(str(path), doraise=True)


def _commit(site: Path, writes: dict[str, bytes | None], operation: str, series: Series) -> None:
    """Make every write happen, or none: journal, stage temps, swap, and roll back on any
    exception. A kill between two steps leaves the journal, which the next run heals from."""
    originals = {rel: read_optional(site / rel) for rel in writes}
    modes = {}
    for rel, old in originals.items():
        modes[rel] = (site / rel).stat().st_mode & 0o7777 if old is not None else NEW_FILE_MODE
    for tmp in leftover_temps(site, writes):
        tmp.unlink()
    _step()
    _write_journal(site, operation, series, sorted(writes))
    _step()
    staged: dict[str, Path] = {}
    done: list[str] = []
    try:
        for rel, data in writes.items():
            if data is not None:
                staged[rel] = _write_temp(site / rel, data, modes[rel])
                _step()
        for rel, data in writes.items():
            if data is None:
                if originals[rel] is not None:
                    _unlink(site / rel)
            else:
                _replace(staged[rel], site / rel)
                del staged[rel]  # only once it is in place: a failed swap leaves a temp to clean
            done.append(rel)
            _step()
        for rel, data in writes.items():
            if sha256_optional(read_optional(site / rel)) != sha256_optional(data):
                raise PatchError(f"{rel}: content on disk differs from what was written")
            if rel.endswith(".py"):
                # Bytecode of the content this run replaced must not outlive it.
                _drop_bytecode(site, rel)
                if data is not None:
                    _py_compile(site / rel)
            _step()
    except BaseException as exc:
        failures = _rollback(site, done, originals, modes)
        for tmp in staged.values():
            with contextlib.suppress(OSError):
                tmp.unlink()
        for rel in writes:  # whatever was compiled from the new content goes with it
            if rel.endswith(".py"):
                _drop_bytecode(site, rel)
        if failures:
            raise PatchError(
                f"FAILED and could not roll back {', '.join(failures)}: reinstall SGLang ({exc})"
            ) from exc
        _remove_journal(site)
        if isinstance(exc, PatchError):
            raise
        if isinstance(exc, py_compile.PyCompileError):
            raise PatchError(f"py_compile failed, rolled back: {exc.msg.strip()}") from exc
        if isinstance(exc, OSError):
            raise PatchError(f"write failed, rolled back: {exc}") from exc
        raise
    _remove_journal(site)
    _step()


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
    """Bytecode cached for a module whose source was replaced or deleted (best effort)."""
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


def half_applied(site: Path, series: Series) -> str | None:
    """What is wrong, in a few words, when the tree is not as a finished apply or revert leaves
    it (all files unpatched and no marker, or all patched and a marker); None when it is."""
    states = _classify(site, series)
    patched = sum(1 for _, state in states.values() if state == "after")
    marker = read_marker(site) is not None
    reasons = []
    journal = read_journal(site)
    if journal is not None:
        reasons.append(f"an interrupted {journal.get('operation', 'unknown')} ({JOURNAL_REL})")
    if 0 < patched < len(states):
        reasons.append(f"{patched} of {len(states)} files patched")
    elif patched == len(states) and not marker:
        reasons.append("every file patched but no marker")
    elif patched == 0 and marker:
        reasons.append("a marker but no file patched")
    temps = leftover_temps(site, [*series.files, MARKER_REL, JOURNAL_REL])
    if temps:
        reasons.append(f"{len(temps)} leftover temp file(s)")
    return "; ".join(reasons) or None


def _refuse_half_applied(site: Path, problem: str) -> PatchError:
    return PatchError(
        f"half-applied tree in {site}: {problem}; run patches/apply.py --target {site} to finish "
        "it (or --revert to undo it)"
    )


def _clear_leftovers(site: Path, series: Series, healed: bool = False) -> None:
    for tmp in leftover_temps(site, [*series.files, MARKER_REL, JOURNAL_REL]):
        tmp.unlink()
    if healed:
        # A run killed between a file's swap and its bytecode step left the old content's
        # bytecode beside the new file; this run does not rewrite that file, so drop it here.
        for rel in series.files:
            if rel.endswith(".py"):
                _drop_bytecode(site, rel)
    if read_journal(site) is not None:
        _remove_journal(site)


def apply(site: str | Path, patches_dir: str | Path, *, dry_run: bool = False) -> Outcome:
    """Bring every target file to its patched state and write the marker (idempotent); a
    half-applied tree is finished (healed), or, in a dry run, refused."""
    site, series = _resolve(site, patches_dir)
    problem = half_applied(site, series)
    if problem and dry_run:
        raise _refuse_half_applied(site, problem)
    healed = f"healed a half-applied tree ({problem}); " if problem else ""
    changes = plan(site, series, reverse=False)
    marker = build_marker(series)
    marker_ok = read_marker(site) == marker
    v, s = series.version, series.source
    if not changes and marker_ok:
        _clear_leftovers(site, series, healed=bool(problem))
        msg = f"{healed}SGLang {v}: series {s} already applied"
        return Outcome("already-applied", v, s, msg, dry_run)
    if not changes:
        if not dry_run:
            _commit(site, {MARKER_REL: marker_bytes(marker)}, "apply", series)
            _clear_leftovers(site, series, healed=bool(problem))
        verb = "would rewrite" if dry_run else "rewrote"
        msg = f"{healed}SGLang {v}: files already patched with series {s}; {verb} the marker"
        return Outcome("marker-updated", v, s, msg, dry_run, [MARKER_REL])
    if dry_run:
        msg = f"SGLang {v}: series {s} applies cleanly to {len(changes)} file(s) (dry run, nothing changed)"
        return Outcome("applied", v, s, msg, True, sorted(changes))
    _commit(site, {**changes, MARKER_REL: marker_bytes(marker)}, "apply", series)
    _clear_leftovers(site, series, healed=bool(problem))
    msg = (
        f"{healed}SGLang {v}: applied series {s} to {len(changes)} file(s): "
        f"{', '.join(sorted(changes))}"
    )
    return Outcome("applied", v, s, msg, False, sorted(changes))


def check(site: str | Path, patches_dir: str | Path) -> Outcome:
    """Dry run of apply: every verification, no writes; a half-applied tree is refused."""
    return apply(site, patches_dir, dry_run=True)


def revert(site: str | Path, patches_dir: str | Path, *, dry_run: bool = False) -> Outcome:
    """Restore every target file to its unpatched state (verified by hash) and drop the marker;
    a half-applied tree is reverted the whole way (healed), or, in a dry run, refused."""
    site, series = _resolve(site, patches_dir)
    problem = half_applied(site, series)
    if problem and dry_run:
        raise _refuse_half_applied(site, problem)
    healed = f"healed a half-applied tree ({problem}); " if problem else ""
    changes = plan(site, series, reverse=True)
    has_marker = (site / MARKER_REL).exists()
    v, s = series.version, series.source
    if not changes and not has_marker:
        _clear_leftovers(site, series, healed=bool(problem))
        msg = f"{healed}SGLang {v}: series {s} is not applied"
        return Outcome("not-applied", v, s, msg, dry_run)
    writes: dict[str, bytes | None] = {**changes}
    if has_marker:
        # First, so that a tree caught half-way never carries a marker for files it lacks.
        writes = {MARKER_REL: None, **changes}
    if dry_run:
        msg = f"SGLang {v}: series {s} reverts cleanly from {len(changes)} file(s) (dry run, nothing changed)"
        return Outcome("reverted", v, s, msg, True, sorted(writes))
    _commit(site, writes, "revert", series)
    _clear_leftovers(site, series, healed=bool(problem))
    msg = f"{healed}SGLang {v}: reverted series {s} from {len(changes)} file(s)"
    return Outcome("reverted", v, s, msg, False, sorted(writes))


__all__ = [
    "Outcome",
    "apply",
    "build_marker",
    "check",
    "half_applied",
    "interrupted",
    "read_marker",
    "revert",
]
