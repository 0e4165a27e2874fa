"""The apply tool against real SGLang wheels: every supported version, every refusal path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from glmserve.preflight.verify import preflight
from glmserve.series import (
    MARKER_REL,
    PatchError,
    apply,
    check,
    detect_version,
    engine,
    load_series,
    read_marker,
    revert,
)
from glmserve.series.lock import load_lock, sha256_bytes
from glmserve.series.regen import read_sources

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
VERSIONS = tuple(sorted(read_sources(PATCHES)))
PINNED = "0.5.12.post1"
BACKEND = "sglang/srt/layers/attention/flashinfer_mla_backend.py"
SHIM = REPO / "patches" / "apply.py"


def run_shim(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """patches/apply.py as the Dockerfile runs it: no site-packages, no PYTHONPATH, no glmserve."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-S", "-E", str(SHIM), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=60,
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_series_cycle_on_every_supported_version(version, make_site, snapshot):
    """check -> apply -> apply again -> revert -> re-apply, each verified by hash, per version."""
    site = make_site(version)
    pristine = snapshot(site)
    series = load_series(PATCHES, version)

    assert detect_version(site) == version
    dry = check(site, PATCHES)
    assert dry.dry_run and dry.changed == sorted(series.files)
    assert snapshot(site) == pristine, "--check must not change anything"

    done = apply(site, PATCHES)
    assert done.action == "applied"
    for path, hashes in series.files.items():
        assert sha256_bytes((site / path).read_bytes()) == hashes.after
    assert preflight(site, import_gather=False) == []
    marker = read_marker(site)
    _, lock_sha = load_lock(PATCHES)
    assert marker == {
        "series": series.source,
        "sglang_version": version,
        "lock_sha256": lock_sha,
        "patches": series.patch_hashes,
        "files": {p: {"before": h.before, "after": h.after} for p, h in series.files.items()},
    }
    patched = snapshot(site)

    again = apply(site, PATCHES)
    assert again.action == "already-applied" and "already applied" in again.message
    assert snapshot(site) == patched

    assert revert(site, PATCHES).action == "reverted"
    assert snapshot(site) == pristine, "revert must restore the exact unpatched tree"
    assert not list(site.rglob("fp8_kv_gather*.pyc")), "stale bytecode of the removed module"
    assert revert(site, PATCHES).action == "not-applied"

    assert apply(site, PATCHES).action == "applied"
    assert snapshot(site) == patched


def test_patched_modules_are_byte_compiled(make_site):
    site = make_site(PINNED)
    apply(site, PATCHES)
    for path in load_series(PATCHES, PINNED).files:
        target = site / path
        assert list((target.parent / "__pycache__").glob(f"{target.stem}.*.pyc")), path


def test_drift_is_refused_and_nothing_changes(make_site, snapshot):
    """A target file that is neither the unpatched nor the patched version is never touched."""
    site = make_site(PINNED)
    target = site / BACKEND
    target.write_bytes(target.read_bytes() + b"# local edit\n")
    before = snapshot(site)
    for op in (lambda: apply(site, PATCHES), lambda: check(site, PATCHES)):
        with pytest.raises(PatchError, match=r"drift: sglang/srt/layers/attention/flashinfer_mla"):
            op()
        assert snapshot(site) == before


def test_drift_after_apply_blocks_revert(make_site, snapshot):
    site = make_site(PINNED)
    apply(site, PATCHES)
    gather = site / "sglang/srt/layers/attention/fp8_kv_gather.py"
    gather.write_bytes(gather.read_bytes() + b"# local edit\n")
    before = snapshot(site)
    with pytest.raises(PatchError, match=r"drift: sglang/srt/layers/attention/fp8_kv_gather.py"):
        revert(site, PATCHES)
    assert snapshot(site) == before


def test_new_module_already_present_from_a_reinstall_is_completed(
    make_site, pristine_site, snapshot
):
    """`pip install --force-reinstall sglang` restores the backend but leaves our added module
    (it is not in SGLang's RECORD) and a stale marker: apply must converge, not refuse."""
    site = make_site(PINNED)
    apply(site, PATCHES)
    patched = snapshot(site)
    pristine_backend = (pristine_site(PINNED) / BACKEND).read_bytes()
    (site / BACKEND).write_bytes(pristine_backend)
    assert apply(site, PATCHES).action == "applied"
    assert snapshot(site) == patched


def test_missing_marker_is_rewritten(make_site, snapshot):
    site = make_site(PINNED)
    apply(site, PATCHES)
    patched = snapshot(site)
    (site / MARKER_REL).unlink()
    # Patched files without a marker are what an apply killed before its last step leaves.
    with pytest.raises(PatchError, match=r"half-applied tree .*: every file patched but no marker"):
        check(site, PATCHES)
    assert not (site / MARKER_REL).exists(), "--check wrote the marker"
    assert apply(site, PATCHES).action == "marker-updated"
    assert snapshot(site) == patched


def test_unsupported_version_is_rejected(make_site, snapshot):
    site = make_site(PINNED)
    meta = next(site.glob("sglang-*.dist-info/METADATA"))
    meta.write_text(meta.read_text().replace(f"Version: {PINNED}", "Version: 0.5.13"))
    version_py = site / "sglang/_version.py"
    version_py.write_text(version_py.read_text().replace(f"'{PINNED}'", "'0.5.13'"))
    before = snapshot(site)
    with pytest.raises(PatchError, match=r"SGLang 0\.5\.13 is not supported.*0\.5\.12\.post1"):
        apply(site, PATCHES)
    proc = run_shim("--target", str(site))
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "0.5.13 is not supported" in proc.stderr
    assert snapshot(site) == before


class _FailOn:
    """Raise on the n-th call of the wrapped engine step (1-based), pass the others through."""

    def __init__(self, real, n: int, exc: BaseException) -> None:
        self.real, self.n, self.exc, self.calls = real, n, exc, 0

    def __call__(self, *args):
        self.calls += 1
        if self.calls == self.n:
            raise self.exc
        return self.real(*args)


def test_failure_swapping_the_second_file_rolls_back_the_first(make_site, snapshot, monkeypatch):
    site = make_site(PINNED)
    pristine = snapshot(site)
    failing = _FailOn(engine._replace, 2, OSError(28, "No space left on device"))
    monkeypatch.setattr(engine, "_replace", failing)
    with pytest.raises(PatchError, match="rolled back"):
        apply(site, PATCHES)
    assert failing.calls == 2, "the failure must hit after the first file was swapped in"
    assert snapshot(site) == pristine
    assert not list(site.rglob("*.glmserve-tmp")), "temp files left behind"


def test_failure_after_the_swap_rolls_back_everything(make_site, snapshot, monkeypatch):
    """py_compile of the swapped-in files fails: the whole transaction is undone."""
    site = make_site(PINNED)
    pristine = snapshot(site)
    monkeypatch.setattr(engine, "_py_compile", _FailOn(engine._py_compile, 2, OSError("boom")))
    with pytest.raises(PatchError, match="rolled back"):
        apply(site, PATCHES)
    assert snapshot(site) == pristine
    # The first module was compiled before the failure: its bytecode goes with the rollback.
    assert not list(site.rglob("*.pyc")), "bytecode compiled from the patched sources"
    assert not list(site.rglob("*.glmserve-tmp")) and not (site / engine.JOURNAL_REL).exists()


def test_failed_revert_leaves_the_tree_patched(make_site, snapshot, monkeypatch):
    site = make_site(PINNED)
    apply(site, PATCHES)
    patched = snapshot(site)
    monkeypatch.setattr(engine, "_unlink", _FailOn(engine._unlink, 1, OSError("busy")))
    with pytest.raises(PatchError, match="rolled back"):
        revert(site, PATCHES)
    assert snapshot(site) == patched


def test_edited_patch_file_is_refused(tmp_path, make_site):
    """The lock pins each patch's bytes: an edited diff is not applied."""
    patches = tmp_path / "patches"
    (patches / PINNED).mkdir(parents=True)
    (patches / "series.lock.json").write_bytes((PATCHES / "series.lock.json").read_bytes())
    for src in (PATCHES / PINNED).glob("*.patch"):
        (patches / PINNED / src.name).write_bytes(src.read_bytes().replace(b"glmserve", b"glm", 1))
    with pytest.raises(PatchError, match="does not match its sha256"):
        apply(make_site(PINNED), patches)


def test_shim_runs_without_glmserve_installed(make_site, snapshot):
    """patches/apply.py needs only the stdlib and the checkout (it runs before pip install)."""
    premise = subprocess.run(
        [sys.executable, "-S", "-E", "-c", "import glmserve"], capture_output=True, cwd="/"
    )
    assert premise.returncode != 0, "glmserve importable without the shim: the test proves nothing"
    site = make_site(PINNED)
    pristine = snapshot(site)

    proc = run_shim("--target", str(site), "--check")
    assert proc.returncode == 0, proc.stderr
    assert "applies cleanly" in proc.stdout and snapshot(site) == pristine

    proc = run_shim("--target", str(site))
    assert proc.returncode == 0, proc.stderr
    assert f"applied series {PINNED}" in proc.stdout
    assert json.loads((site / MARKER_REL).read_text())["series"] == PINNED

    proc = run_shim("--target", str(site))
    assert proc.returncode == 0 and "already applied" in proc.stdout

    proc = run_shim("--target", str(site), "--revert")
    assert proc.returncode == 0 and snapshot(site) == pristine


def test_shim_rejects_a_missing_target_with_one_line(tmp_path):
    proc = run_shim("--target", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "is not a directory" in proc.stderr


def test_shim_rejects_a_directory_without_sglang(tmp_path):
    proc = run_shim("--target", str(tmp_path))
    assert proc.returncode == 1
    assert (
        proc.stderr.strip() == f"glmserve-patch: error: no sglang/ package directory in {tmp_path}"
    )
