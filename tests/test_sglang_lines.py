"""The one table of SGLang lines: every pin in it is what that line's real wheel requires, every
line is its own source series in the lock (the fa3 path patched exactly where the table says),
and the build's base check refuses another line's base or GPU stack in one line each."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from glmserve import sglang_lines
from glmserve.patching.errors import PatchError
from glmserve.patching.wheels import default_cache_dir, fetch_wheel

REPO = Path(__file__).resolve().parents[1]
FA_BACKEND = "sglang/srt/layers/attention/flashattention_backend.py"


def requires(version: str, require) -> dict[str, str]:
    """{project: pinned version} from the line's wheel METADATA (Requires-Dist: x==v)."""
    try:
        wheel = fetch_wheel(version, default_cache_dir())
    except PatchError as exc:
        require(False, f"cannot get the sglang {version} wheel: {exc}")
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    pins = {}
    for line in text.splitlines():
        if line.startswith("Requires-Dist:") and "==" in line and ";" not in line:
            spec = line.split(":", 1)[1].strip()
            name, pinned = spec.split("==", 1)
            pins[name.split("[")[0].strip().lower().replace("_", "-")] = pinned.strip()
    return pins


@pytest.mark.parametrize("version", sorted(sglang_lines.LINES))
def test_each_line_pins_what_its_wheel_requires(version, require):
    line = sglang_lines.get(version)
    pins = requires(version, require)
    assert pins["torch"] == line.torch
    assert pins["flashinfer-python"] == line.flashinfer
    assert pins["sglang-kernel"] == line.sglang_kernel
    assert line.lab_gpu is (line.torch == "2.11.0")  # the lent H200's torch


def test_each_line_is_its_own_series_and_patches_what_the_table_says():
    lock = json.loads((REPO / "patches" / "series.lock.json").read_text())["series"]
    for version, line in sglang_lines.LINES.items():
        assert lock[version]["source"] == version
        assert (FA_BACKEND in lock[version]["files"]) is ("fa3" in line.patched_backends)
        assert "flashinfer" in line.patched_backends
    assert sglang_lines.DEFAULT_LINE in sglang_lines.LINES
    assert sglang_lines.CURRENT_LINE in sglang_lines.LINES


def test_build_args_are_the_line_and_its_base(capsys):
    assert sglang_lines.main(["build-args", "0.5.17"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "SGLANG_LINE=0.5.17",
        "BASE_IMAGE=lmsysorg/sglang:v0.5.17-cu130",
    ]
    assert sglang_lines.main(["build-args", "0.5.12.post1"]) == 0
    assert (
        capsys.readouterr()
        .out.splitlines()[1]
        .endswith("-cu130@sha256:ceaf8b16e02d165143633ac228bbb994a05fe77d7e0526cf035ae4bbf4eacc36")
    )
    assert sglang_lines.main(["build-args", "0.5.18"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "python -m glmserve.sglang_lines: error: SGLang line '0.5.18' is not built here "
        "(lines: 0.5.12.post1, 0.5.17, 0.5.23)"
    ]


def fake_site(tmp_path: Path, **versions: str) -> Path:
    for project, version in versions.items():
        info = tmp_path / f"{project}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
        )
    return tmp_path


def test_the_base_check_refuses_another_line_and_another_gpu_stack(tmp_path):
    right = fake_site(
        tmp_path / "right",
        sglang="0.5.17",
        torch="2.11.0+cu130",
        flashinfer_python="0.6.15.post1",
        sglang_kernel="0.4.5",
    )
    assert sglang_lines.site_problems(right, "0.5.17", gpu_stack_required=True) == []
    assert sglang_lines.site_problems(right, "0.5.23", gpu_stack_required=True) == [
        "the base holds SGLang 0.5.17, the line is 0.5.23: build SGLANG_LINE=0.5.23 on "
        "lmsysorg/sglang:v0.5.23-cu130",
        "the base holds torch 2.11.0+cu130, SGLang 0.5.23 pins 2.14.1",
        "the base holds flashinfer-python 0.6.15.post1, SGLang 0.5.23 pins 0.7.2",
        "the base holds sglang-kernel 0.4.5, SGLang 0.5.23 pins 0.4.10",
    ]
    # CI's stand-in: SGLang alone, no GPU stack; required on a real base.
    bare = fake_site(tmp_path / "bare", sglang="0.5.17")
    assert sglang_lines.site_problems(bare, "0.5.17", gpu_stack_required=False) == []
    assert len(sglang_lines.site_problems(bare, "0.5.17", gpu_stack_required=True)) == 3
