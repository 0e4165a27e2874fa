"""Releases past the lines the series serve are refused, not guessed at: a real release where the
newest series stops applying (0.5.22, whose fa3 file differs from 0.5.23's) and a release where
upstream has removed the cast (made here from 0.5.23's files) get one line from apply.py and are
refused by regen naming the file and hunk, with nothing touched."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from glmserve.series import PatchError, apply
from glmserve.series.regen import regenerate
from glmserve.series.wheels import default_cache_dir, extract_site, fetch_wheel

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
BACKEND = "sglang/srt/layers/attention/flashinfer_mla_backend.py"
FA_BACKEND = "sglang/srt/layers/attention/flashattention_backend.py"
NEWEST = "0.5.23"
# A real release between the lines, whose files neither newer series fits (regen says so).
BETWEEN = "0.5.22"


def snapshot(site: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(site)): p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()
    }


def run_shim(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(PATCHES / "apply.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def between_wheel(require) -> Path:
    try:
        return fetch_wheel(BETWEEN, default_cache_dir())
    except PatchError as exc:
        require(False, f"cannot get the sglang {BETWEEN} wheel: {exc}")
        raise


def test_a_real_release_without_a_series_is_refused_in_one_line(tmp_path, between_wheel):
    site = extract_site(between_wheel, tmp_path / "site", [BACKEND, FA_BACKEND])
    before = snapshot(site)
    proc = run_shim("--target", str(site))
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"glmserve-patch: error: SGLang {BETWEEN} is not supported: no patch series for it in "
        "series.lock.json (supported: 0.5.10, 0.5.10.post1, 0.5.11, 0.5.12, 0.5.12.post1, "
        "0.5.17, 0.5.23, 0.5.9)"
    ]
    assert snapshot(site) == before
    assert run_shim("--target", str(site), "--check").returncode == 1


def _mini_patches(tmp_path: Path, mapping: dict[str, str]) -> Path:
    patches = tmp_path / "patches"
    for source in set(mapping.values()):
        shutil.copytree(PATCHES / source, patches / source)
    (patches / "series.json").write_text(json.dumps({"series": mapping}))
    return patches


def test_the_newest_series_stops_applying_on_the_release_before_it(tmp_path, between_wheel):
    """Mapping 0.5.22 to the 0.5.23 series (its flashinfer file is byte-identical) fails on the
    fa3 file: regen names the version, the file and the hunk, and writes nothing."""
    patches = _mini_patches(tmp_path, {NEWEST: NEWEST, BETWEEN: NEWEST})
    with zipfile.ZipFile(between_wheel) as zf, zipfile.ZipFile(fetch_wheel(NEWEST)) as newest:
        assert zf.read(BACKEND) == newest.read(BACKEND)
        assert zf.read(FA_BACKEND) != newest.read(FA_BACKEND)
    with pytest.raises(
        PatchError, match=rf"flashattention_backend\.py: {NEWEST}/0001-.*on {BETWEEN} hunk #1"
    ):
        regenerate(patches, default_cache_dir(), download=False)
    assert not (patches / "series.lock.json").exists()


def test_a_release_that_dropped_the_cast_is_refused_by_regen_and_apply(tmp_path):
    """Upstream fixing the cast (the two `.to(q.dtype)` lines gone) is a release the series no
    longer fits: regen refuses to lock it, and apply.py refuses it as unlisted, in one line."""
    future = "0.5.24"
    real = fetch_wheel(NEWEST)
    cache = tmp_path / "wheels"
    cache.mkdir()
    out = cache / f"sglang-{future}-py3-none-any.whl"
    with zipfile.ZipFile(real) as zin, zipfile.ZipFile(out, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            if name == BACKEND:
                # The fix upstream would make: read the pool as it is (no whole-pool cast).
                data = data.replace(
                    b".get_key_buffer(layer.layer_id).to(q.dtype)",
                    b".get_key_buffer(layer.layer_id)",
                )
            elif name.endswith(".dist-info/METADATA"):
                data = data.replace(f"Version: {NEWEST}".encode(), f"Version: {future}".encode())
            elif name in ("sglang/version.py", "sglang/_version.py"):
                data = data.replace(NEWEST.encode(), future.encode())
            elif not name.startswith("sglang/srt/layers/attention/"):
                continue
            zout.writestr(name, data)
    with zipfile.ZipFile(out) as zf:
        assert b".to(q.dtype)" not in zf.read(BACKEND).split(b"def forward_decode")[1][:4000]
    patches = _mini_patches(tmp_path, {NEWEST: NEWEST, future: NEWEST})
    shutil.copy(real, cache)
    with pytest.raises(PatchError, match=rf"flashinfer_mla_backend\.py: .* on {future} hunk #"):
        regenerate(patches, cache, download=False)

    site = extract_site(out, tmp_path / "site", [BACKEND, FA_BACKEND])
    before = snapshot(site)
    with pytest.raises(PatchError, match=rf"SGLang {future} is not supported"):
        apply(site, PATCHES)
    proc = run_shim("--target", str(site))
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    assert snapshot(site) == before
