"""workspace: the patch is edited as real files and the diff regenerated from them."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from glmserve.series import PatchError, apply, kernels, workspace
from glmserve.series.lock import load_series
from glmserve.series.regen import main as regen_main
from glmserve.series.udiff import apply_file_patch, parse_patch
from glmserve.series.wheels import default_cache_dir

REPO = Path(__file__).resolve().parents[2]
PINNED = "0.5.12.post1"
BACKEND = "sglang/srt/layers/attention/flashinfer_mla_backend.py"
GATHER = "sglang/srt/layers/attention/fp8_kv_gather.py"
NATIVE = "sglang/srt/layers/attention/fp8_mla_decode.py"
FA_BACKEND = "sglang/srt/layers/attention/flashattention_backend.py"


@pytest.fixture
def patches(tmp_path, pristine_site, require) -> Path:
    """A private copy of patches/ (the tests rewrite its diff), the pinned wheel cached."""
    require(shutil.which("git") is not None, "git is needed for git diff --no-index")
    pristine_site(PINNED)  # downloads the wheel into the shared cache if missing
    dest = tmp_path / "patches"
    shutil.copytree(REPO / "patches", dest)
    return dest


def _open(tmp_path: Path, patches: Path) -> Path:
    return workspace.open_workspace(
        tmp_path / "ws", patches, PINNED, default_cache_dir(), download=False
    )


def test_an_unedited_work_area_reproduces_the_committed_patch(tmp_path, patches):
    """The committed diff is exactly git's diff of pristine vs patched real files."""
    (committed,) = (patches / PINNED).glob("*.patch")
    before = committed.read_bytes()
    ws = _open(tmp_path, patches)
    assert (ws / "a" / BACKEND).read_bytes() != (ws / "b" / BACKEND).read_bytes()
    assert not (ws / "a" / GATHER).exists() and (ws / "b" / GATHER).is_file()
    assert not list(ws.rglob("__pycache__")) and not list(ws.rglob(".glmserve-patch.json"))
    target, changed = workspace.workspace_diff(ws, patches)
    assert (target, changed) == (committed, False)
    assert committed.read_bytes() == before


def test_edits_to_real_files_become_the_new_diff(tmp_path, patches, make_site, capsys, monkeypatch):
    """Edit b/ (the wiring) and a kernel's one source, diff, regen: the lock follows and apply
    ships exactly the edited wiring and the source's kernel bytes."""
    kernels_dir = tmp_path / "kernels"
    shutil.copytree(kernels.KERNELS_DIR, kernels_dir)
    monkeypatch.setattr(kernels, "KERNELS_DIR", kernels_dir)
    ws = _open(tmp_path, patches)
    gather = kernels_dir / "fp8_kv_gather.py"
    gather.write_bytes(gather.read_bytes() + b"\n# an edit made in the kernel's source\n")
    backend = ws / "b" / BACKEND
    backend.write_bytes(b"# glmserve: first line edited\n" + backend.read_bytes())
    (ws / "b" / "sglang" / "srt" / "__pycache__").mkdir()  # trying the edit leaves bytecode
    (ws / "b" / "sglang" / "srt" / "__pycache__" / "x.pyc").write_bytes(b"\0binary")
    (committed,) = (patches / PINNED).glob("*.patch")
    old = committed.read_bytes()

    target, changed = workspace.workspace_diff(ws, patches)
    new = committed.read_bytes()
    assert target == committed and changed and new != old
    preamble = old[: old.index(b"diff --git ")]
    assert new.startswith(preamble) and b"binary" not in new.lower()
    for fp in parse_patch(new):
        result = apply_file_patch((ws / "a" / fp.path).read_bytes() if fp.old_path else None, fp)
        assert result == (ws / "b" / fp.path).read_bytes()

    (patches / "series.json").write_text(json.dumps({"series": {PINNED: PINNED}}))
    assert regen_main(["--patches", str(patches), "--offline"]) == 0
    site = make_site(PINNED)
    apply(site, patches)
    assert (site / GATHER).read_bytes() == gather.read_bytes()
    assert (site / BACKEND).read_bytes() == backend.read_bytes()
    assert load_series(patches, PINNED).source == PINNED


def test_a_kernel_edited_in_the_work_area_is_refused(tmp_path, patches, capsys):
    """The kernels have one source (src/glmserve/kernels/): an edit of b/'s generated copy would
    be lost at the next regen, so `diff` refuses it in one line and writes nothing."""
    ws = _open(tmp_path, patches)
    copy = ws / "b" / NATIVE
    copy.write_bytes(copy.read_bytes() + b"# edited in the wrong place\n")
    (committed,) = (patches / PINNED).glob("*.patch")
    old = committed.read_bytes()
    assert workspace.main(["diff", str(ws), "--patches", str(patches)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "src/glmserve/kernels/fp8_mla_decode.py" in err
    assert committed.read_bytes() == old


def test_refusals_are_one_line_and_change_nothing(tmp_path, patches, monkeypatch, capsys):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep").write_text("mine")
    opening = ["open", str(busy), "--patches", str(patches), "--offline"]
    assert workspace.main(opening) == 1
    assert "several source series" in capsys.readouterr().err
    assert workspace.main([*opening, "--series", PINNED]) == 1
    assert "not empty" in capsys.readouterr().err and (busy / "keep").read_text() == "mine"

    assert workspace.main(["diff", str(busy), "--patches", str(patches)]) == 1
    assert "not a work area" in capsys.readouterr().err

    ws = _open(tmp_path, patches)
    (committed,) = (patches / PINNED).glob("*.patch")
    old = committed.read_bytes()
    monkeypatch.setattr(workspace, "GIT_DIFF", ("glmserve-no-such-git", "diff"))
    assert workspace.main(["diff", str(ws), "--patches", str(patches)]) == 1
    assert "git is needed" in capsys.readouterr().err
    assert committed.read_bytes() == old


@pytest.mark.parametrize("source", ["0.5.17", "0.5.23"])
def test_an_unedited_work_area_of_a_newer_series_reproduces_it(tmp_path, patches, source):
    """Each line's series is the diff of real files too, its second target file included."""
    (committed,) = (patches / source).glob("*.patch")
    before = committed.read_bytes()
    ws = workspace.open_workspace(tmp_path / "ws", patches, source, default_cache_dir())
    assert (ws / "a" / FA_BACKEND).read_bytes() != (ws / "b" / FA_BACKEND).read_bytes()
    assert workspace.workspace_diff(ws, patches) == (committed, False)
    assert committed.read_bytes() == before


def test_a_new_series_starts_from_the_release_files_and_the_old_modules(tmp_path, patches):
    """open --new: the newer wheel's pristine files (plus --add-file) in a/ and b/, the source's
    new modules in b/ as they ship; the first diff takes the source's preamble."""
    befores = load_series(patches, "0.5.17").files
    with pytest.raises(PatchError, match=r"series 0\.5\.17 already exists"):
        workspace.open_workspace(tmp_path / "again", patches, "0.5.17", new_from=PINNED)
    shutil.rmtree(patches / "0.5.17")
    ws = workspace.open_workspace(
        tmp_path / "new",
        patches,
        "0.5.17",
        default_cache_dir(),
        new_from=PINNED,
        add_files=(FA_BACKEND,),
    )
    for rel in (BACKEND, FA_BACKEND):
        digest = hashlib.sha256((ws / "a" / rel).read_bytes()).hexdigest()
        assert digest == befores[rel].before  # the 0.5.17 wheel's own file
        assert (ws / "b" / rel).read_bytes() == (ws / "a" / rel).read_bytes()
    shipped = _open(tmp_path, patches)
    assert (ws / "b" / GATHER).read_bytes() == (shipped / "b" / GATHER).read_bytes()
    assert not (ws / "a" / GATHER).exists()

    target, changed = workspace.workspace_diff(ws, patches)
    (pinned,) = (patches / PINNED).glob("*.patch")
    assert changed and target == patches / "0.5.17" / pinned.name  # the source's name
    preamble = pinned.read_bytes()[: pinned.read_bytes().index(b"diff --git ")]
    assert target.read_bytes().startswith(preamble)
    # Nothing of the release's own files was edited yet: only the new modules are in the diff.
    assert {fp.path for fp in parse_patch(target.read_bytes())} == {GATHER, NATIVE}


def test_open_refuses_a_version_that_is_not_a_source(tmp_path, patches):
    with pytest.raises(PatchError, match=r"0\.5\.10 is not a source series"):
        workspace.open_workspace(tmp_path / "ws", patches, "0.5.10", download=False)
