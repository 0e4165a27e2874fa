"""The kernels have one source (src/glmserve/kernels/); every line's diff carries generated copies."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from glmserve.series import kernels
from glmserve.series.regen import differences, read_sources, regenerate
from glmserve.series.wheels import default_cache_dir

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
SOURCES = sorted(set(read_sources(PATCHES).values()))


@pytest.mark.parametrize("source", SOURCES)
def test_every_line_adds_each_kernel_as_a_copy_of_its_source(source):
    """Each source series adds both kernels, and its sections are the sources rendered."""
    (patch,) = (PATCHES / source).glob("*.patch")
    data = patch.read_bytes()
    added = [kernels._section_path(sec) for sec in kernels._sections(data)[1]]
    assert sorted(set(added) & set(kernels.KERNEL_FILES)) == sorted(kernels.KERNEL_FILES)
    assert kernels.generate(data) == data, "stale kernel copy: run python -m glmserve.series.regen"
    for rel in kernels.KERNEL_FILES:
        assert kernels.added_file_section(rel, kernels.kernel_source(rel)) in data


def test_the_rendering_is_gits_own(tmp_path, require):
    """A new file's section is byte for byte what `git diff --no-index --no-prefix` writes."""
    require(shutil.which("git") is not None, "git is needed for git diff --no-index")
    rel = "sglang/srt/layers/attention/fp8_mla_decode.py"
    content = kernels.kernel_source(rel)
    (tmp_path / "a" / "sglang").mkdir(parents=True)
    (tmp_path / "b" / rel).parent.mkdir(parents=True)
    (tmp_path / "b" / rel).write_bytes(content)
    proc = subprocess.run(
        ["git", "diff", "--no-index", "--no-prefix", "--no-color", "a/sglang", "b/sglang"],
        cwd=tmp_path,
        capture_output=True,
        env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull},
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == kernels.added_file_section(rel, content)


def test_a_changed_source_makes_every_line_stale_until_regen(tmp_path, monkeypatch, pristine_site):
    """regen --check fails on every series once a kernel's source moves; regen rewrites them."""
    for version in read_sources(PATCHES):
        pristine_site(version)  # the wheels regen verifies against
    moved = tmp_path / "kernels"
    shutil.copytree(kernels.KERNELS_DIR, moved)
    native = moved / "fp8_mla_decode.py"
    native.write_bytes(native.read_bytes() + b"# moved on\n")
    monkeypatch.setattr(kernels, "KERNELS_DIR", moved)
    outputs, stale = regenerate(PATCHES, default_cache_dir(), download=False)
    changed = differences(PATCHES, outputs, stale)
    assert sorted(changed) == sorted(
        ["series.lock.json", *(f"{s}/{p.name}" for s in SOURCES for p in (PATCHES / s).glob("*"))]
    )
    for source in SOURCES:
        (name,) = [p.name for p in (PATCHES / source).glob("*.patch")]
        assert b"+# moved on\n" in outputs[f"{source}/{name}"]


def test_a_kernel_source_without_a_final_newline_is_refused():
    with pytest.raises(kernels.PatchError, match="newline"):
        kernels.added_file_section("x.py", b"x = 1")
