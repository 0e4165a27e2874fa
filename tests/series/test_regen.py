"""regen: the committed lock is exactly what the source series and the real wheels produce."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from glmserve.series import PatchError, apply, check
from glmserve.series.regen import differences, main, read_sources, regenerate
from glmserve.series.udiff import parse_patch
from glmserve.series.wheels import default_cache_dir, fetch_wheel

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
PINNED = "0.5.12.post1"
BACKEND = "sglang/srt/layers/attention/flashinfer_mla_backend.py"
GATHER = "sglang/srt/layers/attention/fp8_kv_gather.py"


@pytest.fixture(scope="module")
def wheels(pristine_site) -> Path:
    """The shared wheel cache, filled for every supported version (pristine_site downloads)."""
    for version in read_sources(PATCHES):
        pristine_site(version)
    return default_cache_dir()


def test_committed_series_and_lock_equal_regen_output(wheels):
    """The lock can never drift from the source series and the wheels; no per-version copies."""
    outputs, stale = regenerate(PATCHES, wheels, download=False)
    assert differences(PATCHES, outputs, stale) == [], "run: python -m glmserve.series.regen"
    lock = json.loads(outputs["series.lock.json"])
    assert sorted(lock["series"]) == sorted(read_sources(PATCHES))
    sources = set(read_sources(PATCHES).values())
    # Never a per-version copy: the lock, and each source series' own patches (their kernels
    # generated from src/glmserve/kernels/).
    patch_files = {f"{p.parent.name}/{p.name}" for p in PATCHES.glob("*/*.patch")}
    assert set(outputs) == {"series.lock.json"} | patch_files
    assert {p.parent.name for p in PATCHES.glob("*/*.patch")} == sources
    # FACTS: the backend is byte-identical across the versions one source serves, so their
    # before/after hashes agree; regen verified that per wheel rather than assuming it. A
    # release whose file differs has its own source series.
    for source in sources:
        served = [e for e in lock["series"].values() if e["source"] == source]
        assert len({e["files"][BACKEND]["before"] for e in served}) == 1, source
    per_source = {e["source"]: e["files"][BACKEND]["before"] for e in lock["series"].values()}
    assert len(set(per_source.values())) == len(sources)
    assert all(e["files"][GATHER]["before"] is None for e in lock["series"].values())


def _mini_patches(tmp_path: Path, versions: dict[str, str]) -> Path:
    patches = tmp_path / "patches"
    (patches / PINNED).mkdir(parents=True)
    for src in (PATCHES / PINNED).glob("*.patch"):
        shutil.copy(src, patches / PINNED / src.name)
    (patches / "series.json").write_text(json.dumps({"series": versions}))
    return patches


def _doctored_wheel(real: Path, dest_dir: Path, version: str, edits: dict[str, bytes]) -> Path:
    """A wheel named for `version` holding `real`'s files with `edits` replacing/adding members."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(real) as zin, zipfile.ZipFile(out, "w") as zout:
        for name in zin.namelist():
            if name.startswith("sglang/srt/layers/attention/") or ".dist-info/" in name:
                zout.writestr(name, edits.pop(name, zin.read(name)))
            elif name in ("sglang/_version.py", "sglang/version.py", "sglang/__init__.py"):
                zout.writestr(name, zin.read(name))
        for name, data in edits.items():
            zout.writestr(name, data)
    return out


def test_regen_verifies_each_version_instead_of_assuming(tmp_path, wheels):
    """A release whose backend differs by one context line makes regen fail, naming it."""
    patches = _mini_patches(tmp_path, {PINNED: PINNED, "0.5.9": PINNED})
    cache = tmp_path / "wheels"
    cache.mkdir()
    shutil.copy(fetch_wheel(PINNED, wheels, download=False), cache)
    real_9 = fetch_wheel("0.5.9", wheels, download=False)
    with zipfile.ZipFile(real_9) as zf:
        lines = zf.read(BACKEND).split(b"\n")
    # Perturb the first line the series' first backend hunk expects: a one-line difference.
    (patch,) = (patches / PINNED).glob("*.patch")
    first = next(fp for fp in parse_patch(patch.read_bytes()) if fp.path == BACKEND).hunks[0]
    lines[first.old_start - 1] += b"  # moved"
    _doctored_wheel(real_9, cache, "0.5.9", {BACKEND: b"\n".join(lines)})
    with pytest.raises(PatchError, match=r"flashinfer_mla_backend\.py: .* on 0\.5\.9 hunk #1"):
        regenerate(patches, cache, download=False)


def test_regen_refuses_a_release_that_already_ships_the_new_module(tmp_path, wheels):
    patches = _mini_patches(tmp_path, {PINNED: PINNED, "0.5.11": PINNED})
    cache = tmp_path / "wheels"
    cache.mkdir()
    shutil.copy(fetch_wheel(PINNED, wheels, download=False), cache)
    _doctored_wheel(fetch_wheel("0.5.11", wheels, download=False), cache, "0.5.11", {GATHER: b""})
    with pytest.raises(PatchError, match=r"creates .*fp8_kv_gather\.py, but sglang 0\.5\.11"):
        regenerate(patches, cache, download=False)


def test_cli_check_then_write_then_check(tmp_path, wheels, capsys):
    """--check names the stale lock and a leftover per-version copy; a write fixes both."""
    patches = _mini_patches(tmp_path, {PINNED: PINNED, "0.5.10": PINNED})
    (patches / "0.5.10").mkdir()
    (patches / "0.5.10" / "0001-old-copy.patch").write_text("stale\n")
    (patches / "0.5.13").mkdir()  # an unlisted series being ported: not regen's to delete
    (patches / "0.5.13" / "0001-wip.patch").write_text("work in progress\n")
    args = ["--patches", str(patches), "--wheels", str(wheels), "--offline"]

    assert main([*args, "--check"]) == 1
    err = capsys.readouterr().err
    assert "0.5.10/0001-old-copy.patch" in err and "series.lock.json" in err
    assert "0.5.13" not in err

    assert main(args) == 0
    assert not (patches / "0.5.10").exists()
    assert (patches / "0.5.13" / "0001-wip.patch").is_file()
    lock = json.loads((patches / "series.lock.json").read_text())
    assert sorted(lock["series"]) == ["0.5.10", PINNED]
    assert {e["source"] for e in lock["series"].values()} == {PINNED}

    capsys.readouterr()
    assert main([*args, "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_every_version_applies_the_source_series(tmp_path, wheels, make_site):
    """With no copy on disk, a non-source version is patched from the source's own diffs."""
    patches = _mini_patches(tmp_path, {PINNED: PINNED, "0.5.10": PINNED})
    assert main(["--patches", str(patches), "--wheels", str(wheels), "--offline"]) == 0
    assert not (patches / "0.5.10").exists()
    site = make_site("0.5.10")
    outcome = apply(site, patches)
    assert outcome.action == "applied" and outcome.series == PINNED
    # Without the source the version cannot even be checked: the diffs really come from it.
    shutil.rmtree(patches / PINNED)
    with pytest.raises(PatchError, match=r"0\.5\.12\.post1 holds no patches"):
        check(site, patches)


def test_series_json_must_name_real_sources(tmp_path):
    patches = _mini_patches(tmp_path, {"0.5.9": "0.5.10"})
    with pytest.raises(PatchError, match=r"0\.5\.9 uses 0\.5\.10"):
        read_sources(patches)
