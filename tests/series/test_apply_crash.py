"""apply.py killed (SIGKILL) between every pair of its steps, on the real pinned SGLang tree.

Rule: no half-applied tree is ever accepted. After a kill at any step boundary the tree is
either exactly as a finished run leaves it, or `apply.py --check` refuses it in one line, the
launcher refuses to serve from it, and the next apply (or revert) heals it to exactly the patched
(or pristine) tree: no temp file left, no bytecode that does not belong to the source beside it.

The kill comes from the engine's test hook (GLMSERVE_PATCH_KILL_AT=N: SIGKILL at the N-th step
boundary); N runs from 1 until a run completes, so every boundary is hit.
"""

from __future__ import annotations

import io
import marshal
import shutil
import signal
from pathlib import Path

import pytest
from support.launch import pinned_sglang_parser
from test_apply import PATCHES, PINNED, run_shim

from glmserve.launch import Host, LaunchError, run
from glmserve.series import apply, engine, load_series, revert
from glmserve.series.lock import MARKER_REL

MAX_STEPS = 40  # far above the 15 steps of an apply: a loop that never completes fails


def bytecode_problems(site: Path, rels) -> list[str]:
    """Every cached .pyc of the touched modules must be compiled from the source beside it, with
    the header Python checks before loading it instead of recompiling."""
    problems = []
    for rel in rels:
        source = site / rel
        for pyc in (source.parent / "__pycache__").glob(f"{source.stem}.*.pyc"):
            if not source.exists():
                problems.append(f"{pyc.name}: bytecode of a deleted module")
                continue
            data, st = pyc.read_bytes(), source.stat()
            mtime, size = (
                int.from_bytes(data[8:12], "little"),
                int.from_bytes(data[12:16], "little"),
            )
            fresh = compile(source.read_bytes(), str(source), "exec", dont_inherit=True)
            # Code objects compare by content (marshal's bytes vary with reference counts).
            stale = marshal.loads(data[16:]) != fresh
            if stale or (mtime, size) != (int(st.st_mtime) & 0xFFFFFFFF, st.st_size):
                problems.append(f"{pyc.name}: not compiled from the source beside it")
    return problems


def leftovers(site: Path) -> list[str]:
    return sorted(str(p.relative_to(site)) for p in site.rglob(f"*{engine.TEMP_SUFFIX}"))


def launcher_refusal(site: Path, tmp_path: Path) -> str | None:
    """The launcher's --dry-run on this tree (real marker, journal and preflight checks): its
    one-line refusal, or None when it would serve."""
    environ = {
        "HOME": str(tmp_path / "home"),
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi"),
        "GLMSERVE_BUILD_INFO": str(tmp_path / "run" / "build-info.json"),
    }
    host = Host(
        environ=environ,
        sglang_site=lambda: site,
        sglang_parser=pinned_sglang_parser,
        execvpe=lambda *_a: pytest.fail("--dry-run must not exec"),
    )
    try:
        run(["--dry-run", "--profile", "tiny-mla"], host, out=io.StringIO(), err=io.StringIO())
    except LaunchError as exc:
        assert "\n" not in str(exc)
        return str(exc)
    return None


def crash_points(operation: str, start: Path, scratch: Path):
    """Yield (N, crashed tree) for every kill point of `operation` run on a copy of `start`."""
    args = ["--revert"] if operation == "revert" else []
    for n in range(1, MAX_STEPS):
        site = scratch / f"{operation}-{n}"
        shutil.copytree(start, site)
        proc = run_shim("--target", str(site), *args, env_extra={engine.KILL_AT_ENV: str(n)})
        if proc.returncode == 0:
            return n - 1  # completes: every boundary before it was a kill point
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        yield n, site
    pytest.fail(f"{operation} never completed within {MAX_STEPS} steps")


@pytest.fixture
def trees(make_site, snapshot, tmp_path):
    pristine_site = make_site(PINNED)
    pristine = snapshot(pristine_site)
    patched_site = tmp_path / "patched-start"
    shutil.copytree(pristine_site, patched_site)
    apply(patched_site, PATCHES)
    shutil.rmtree(patched_site / "sglang/srt/layers/attention/__pycache__")
    return {
        "pristine": (pristine_site, pristine),
        "patched": (patched_site, snapshot(patched_site)),
    }


@pytest.mark.parametrize(("operation", "start"), [("apply", "pristine"), ("revert", "patched")])
def test_kill_9_between_every_pair_of_steps_never_leaves_an_accepted_half_tree(
    operation, start, trees, snapshot, tmp_path
):
    series = load_series(PATCHES, PINNED)
    touched = [*series.files, MARKER_REL]
    (pristine_site, pristine), (patched_site, patched) = trees["pristine"], trees["patched"]
    start_site = pristine_site if start == "pristine" else patched_site
    kills = half = 0
    points = crash_points(operation, start_site, tmp_path)
    while True:
        try:
            n, site = next(points)
        except StopIteration as done:
            steps = done.value
            break
        kills += 1
        problem = engine.half_applied(site, series)
        if problem is None:
            # Killed before the first change or after the last: exactly one of the two trees.
            assert snapshot(site) in (pristine, patched), f"kill at {n}: unflagged mixed tree"
            assert not leftovers(site), f"kill at {n}"
        else:
            half += 1
            proc = run_shim("--target", str(site), "--check")
            assert proc.returncode == 1, f"kill at {n}: --check accepted it: {proc.stdout}"
            assert proc.stderr.count("\n") == 1 and "half-applied tree" in proc.stderr
            refusal = launcher_refusal(site, tmp_path)
            assert refusal is not None, f"kill at {n} ({problem}): the launcher would serve"
        # Healing, both ways, from a copy each.
        for heal, want in ((apply, patched), (revert, pristine)):
            copy = tmp_path / f"heal-{heal.__name__}-{operation}-{n}"
            shutil.copytree(site, copy)
            outcome = heal(copy, PATCHES)
            assert ("healed" in outcome.message) == (problem is not None), outcome.message
            assert snapshot(copy) == want, f"kill at {n}: {heal.__name__} did not heal it"
            assert engine.half_applied(copy, series) is None
            assert not leftovers(copy), f"kill at {n}: {heal.__name__} left temp files"
            assert not bytecode_problems(copy, touched), f"kill at {n}"
    assert kills == steps and steps >= 10, (kills, steps)
    assert half >= steps - 2, "most kill points must leave a flagged tree"
    print(f"{operation}: {kills} kill points, {half} half-applied trees, all refused and healed")


def test_an_older_tools_orphan_temp_files_are_removed(make_site):
    """mkstemp-named temps of the previous engine (`.NAME.XXXX.glmserve-tmp`) never cleaned."""
    site = make_site(PINNED)
    backend_dir = site / "sglang/srt/layers/attention"
    orphan = backend_dir / ".flashinfer_mla_backend.py.k2j3h4.glmserve-tmp"
    orphan.write_text("half a file")
    proc = run_shim("--target", str(site), "--check")
    assert proc.returncode == 1 and "1 leftover temp file(s)" in proc.stderr
    assert "healed" in apply(site, PATCHES).message
    assert not orphan.exists() and not leftovers(site)


def test_the_probes_half_tree_is_refused_by_check_and_the_launcher(trees, snapshot, tmp_path):
    """What a kill between two swaps of the previous engine left (no journal): the backend
    patched, the two modules it imports missing, no marker. --check called it clean."""
    (pristine_site, _), (patched_site, patched) = trees["pristine"], trees["patched"]
    site = tmp_path / "probe"
    shutil.copytree(pristine_site, site)
    backend = "sglang/srt/layers/attention/flashinfer_mla_backend.py"
    shutil.copyfile(patched_site / backend, site / backend)
    proc = run_shim("--target", str(site), "--check")
    assert proc.returncode == 1, proc.stdout
    assert "half-applied tree" in proc.stderr and "1 of 3 files patched" in proc.stderr
    assert launcher_refusal(site, tmp_path) is not None
    assert "healed" in apply(site, PATCHES).message and snapshot(site) == patched
