"""Preflight: it must pass on the real patched tree and catch every way the wiring can be lost."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from glmserve.preflight.flow import Module
from glmserve.preflight.rules import GATHER_MODULE
from glmserve.preflight.verify import BACKEND_REL, GATHER_REL, cuda_build_problems, main, preflight
from glmserve.series import MARKER_REL, apply, load_series
from glmserve.series.udiff import FilePatch, Hunk, apply_file_patch

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
PINNED = "0.5.12.post1"


@pytest.fixture
def patched(make_site) -> Path:
    site = make_site(PINNED)
    assert apply(site, PATCHES).action == "applied"
    return site


@pytest.fixture
def kernel_deps(require) -> None:
    """torch and Triton, which the image has and the kernels extra installs (make venv)."""
    have = all(importlib.util.find_spec(m) for m in ("torch", "triton"))
    require(have, "torch and Triton (the kernels extra) are not installed")


def without_marker_noise(problems: list[str]) -> list[str]:
    return [p for p in problems if MARKER_REL not in p]


def test_real_patched_tree_passes_including_the_file_import(patched, kernel_deps):
    assert preflight(patched, import_gather=True) == []


def test_real_patched_tree_passes_static_checks(patched):
    assert preflight(patched, import_gather=False) == []


def test_unpatched_tree_fails(make_site):
    problems = preflight(make_site(PINNED), import_gather=False)
    text = "\n".join(problems)
    assert "no valid patch marker" in text
    assert "fp8_kv_gather.py: missing" in text
    assert "[structure] does not import" in text
    assert "[no-full-cast] forward_decode casts the KV pool" in text


def test_file_edited_after_patching_is_reported(patched):
    target = patched / BACKEND_REL
    target.write_bytes(target.read_bytes() + b"\n# hotfix\n")
    assert preflight(patched, import_gather=False) == [
        f"{BACKEND_REL}: differs from the patched file recorded in {MARKER_REL}"
    ]


def test_marker_for_another_version_is_reported(patched):
    marker = json.loads((patched / MARKER_REL).read_text())
    marker["sglang_version"] = "0.5.9"
    (patched / MARKER_REL).write_text(json.dumps(marker))
    (problem,) = preflight(patched, import_gather=False)
    assert "is for SGLang 0.5.9, but 0.5.12.post1 is installed" in problem


def test_every_semantic_hunk_of_the_backend_diff_is_necessary(patched):
    """Undo one backend hunk at a time (the rest stays applied): preflight must notice each,
    so no part of the wiring (import, state, decode, extend, plan-time row counts) can be lost
    silently. Hunks that only change comments/whitespace are exempt."""
    series = load_series(PATCHES, PINNED)
    ((_, fp),) = series.file_patches()[BACKEND_REL]
    patched_src = (patched / BACKEND_REL).read_bytes()
    undetected = []
    for number, h in enumerate(fp.hunks, start=1):
        undo = Hunk(h.new_start, h.new_len, h.new_start, h.old_len, h.new_lines, h.old_lines)
        mutated = apply_file_patch(patched_src, FilePatch(BACKEND_REL, BACKEND_REL, (undo,)))
        if ast.dump(ast.parse(mutated)) == ast.dump(ast.parse(patched_src)):
            continue
        (patched / BACKEND_REL).write_bytes(mutated)
        if not without_marker_noise(preflight(patched, import_gather=False)):
            undetected.append(f"hunk #{number} (@@ -{h.old_start})")
    (patched / BACKEND_REL).write_bytes(patched_src)
    assert undetected == []


def test_gather_module_that_fails_to_import_is_reported(patched, kernel_deps):
    target = patched / GATHER_REL
    target.write_bytes(target.read_bytes() + b"\nraise RuntimeError('broken at import')\n")
    problems = without_marker_noise(preflight(patched, import_gather=True))
    assert problems == ["fp8_kv_gather.py: import failed: RuntimeError: broken at import"]


def test_gather_module_missing_an_imported_name_is_reported(patched):
    imported = sorted(
        Module(ast.parse((patched / BACKEND_REL).read_bytes()), GATHER_MODULE).gather_names
    )
    assert imported, "the backend imports nothing from the gather module"
    target = patched / GATHER_REL
    tree = ast.parse(target.read_bytes())
    tree.body = [n for n in tree.body if getattr(n, "name", None) != imported[0]]
    target.write_text(ast.unparse(tree))
    problems = without_marker_noise(preflight(patched, import_gather=False))
    assert f"fp8_kv_gather.py: does not define {imported[0]}, which the backend imports" in problems


def test_switch_must_exist_somewhere(patched):
    for rel in (BACKEND_REL, GATHER_REL):
        text = (patched / rel).read_bytes()
        (patched / rel).write_bytes(text.replace(b"GLMSERVE_FP8_GATHER", b"GLMSERVE_OTHER"))
    problems = without_marker_noise(preflight(patched, import_gather=False))
    assert any("GLMSERVE_FP8_GATHER is read nowhere" in p for p in problems)


def test_preflight_checks_wrapper_reads_against_the_given_flashinfer(patched, tmp_path):
    """The attribute the rules saw the gather read is checked against FlashInfer's run()."""
    pkg = tmp_path / "flashinfer"
    pkg.mkdir()
    (pkg / "mla.py").write_text(
        "class BatchMLAPagedAttentionWrapper:\n"
        "    def __init__(self, kv):\n        self._kv_indices_buf = kv\n"
        "    def run(self, q):\n        return self._kernel(q, self._kv_indices)\n"
    )
    problems = preflight(patched, import_gather=False, flashinfer=pkg)
    assert len(problems) == 1
    assert "run() never reads '_kv_indices_buf'" in problems[0]


# --- CLI -------------------------------------------------------------------------------------


def test_cli_exit_codes(patched, tmp_path, capsys):
    assert main(["--target", str(patched), "--no-import"]) == 0
    assert f"ok: SGLang {PINNED} patched with series {PINNED}" in capsys.readouterr().out
    (patched / MARKER_REL).unlink()
    assert main(["--target", str(patched), "--no-import"]) == 1
    assert "FAIL: no valid patch marker" in capsys.readouterr().err
    assert main(["--target", str(tmp_path / "missing")]) == 2


def test_cli_rules_only(patched, tmp_path, capsys):
    backend = patched / BACKEND_REL
    assert main(["--rules-only", str(backend)]) == 0
    assert (
        "passes the backend rules (run sites 2, plan sites 3, native kernel sites 2)"
        in capsys.readouterr().out
    )
    broken = tmp_path / "flashinfer_mla_backend.py"
    broken.write_text(
        backend.read_text().replace("if self.fp8_gather is None:", "if self.fp8_gather:")
    )
    assert main(["--rules-only", str(broken)]) == 1
    err = capsys.readouterr().err
    assert "FAIL: flashinfer_mla_backend.py:" in err and "[switch-polarity]" in err
    (tmp_path / "junk.py").write_text("def (:\n")
    assert main(["--rules-only", str(tmp_path / "junk.py")]) == 1
    assert "junk.py: does not parse" in capsys.readouterr().err
    assert main(["--rules-only", str(tmp_path / "absent.py")]) == 2
    with pytest.raises(SystemExit):
        main(["--rules-only", str(backend), "--target", str(patched)])


def test_cli_as_module_runs(patched):
    proc = subprocess.run(
        [sys.executable, "-m", "glmserve.preflight", "--target", str(patched), "--no-import"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def test_build_expectations_hold_on_the_real_patched_tree(patched):
    """What the Dockerfile writes into its labels must be what apply.py recorded."""
    marker = json.loads((patched / MARKER_REL).read_text())
    args = ["--target", str(patched), "--no-import", "--expect-version", PINNED,
            "--expect-series", marker["series"], "--expect-lock", marker["lock_sha256"]]  # fmt: skip
    assert main(args) == 0


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--expect-version", "0.5.11", "installed SGLang is 0.5.12.post1, the build pins 0.5.11"),
        ("--expect-series", "0.5.9", "marker series is '0.5.12.post1'"),
        ("--expect-lock", "0" * 64, "marker lock_sha256 is"),
    ],
)
def test_a_label_that_disagrees_with_the_install_fails(patched, capsys, flag, value, needle):
    assert main(["--target", str(patched), "--no-import", flag, value]) == 1
    assert needle in capsys.readouterr().err


TORCH_VERSION_PY = """\
from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'xpu']
__version__ = '2.11.0+cu{tag}'
debug = False
cuda: Optional[str] = {cuda}
git_version = '0123456789abcdef'
hip: Optional[str] = None
"""


@pytest.mark.parametrize(
    ("cuda", "tag", "needle"),
    [
        ("'13.0'", "130", None),
        ("'12.9'", "129", "built for CUDA 12.9, the image needs CUDA 13.x"),
        ("None", "cpu", "not a CUDA build"),
    ],
)
def test_the_base_image_cuda_build_is_checked(tmp_path, capsys, cuda, tag, needle):
    """A digest that is really a cu12x `latest` fails the build at the preflight."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "version.py").write_text(TORCH_VERSION_PY.format(cuda=cuda, tag=tag))
    problems = cuda_build_problems(site, "13", torch_required=True)
    if needle is None:
        assert problems == []
    else:
        [problem] = problems
        assert needle in problem


def test_a_torchless_stand_in_base_passes_only_with_no_import(tmp_path, monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert cuda_build_problems(tmp_path, "13", torch_required=False) == []
    [problem] = cuda_build_problems(tmp_path, "13", torch_required=True)
    assert "torch not found" in problem


def test_expect_cuda_reaches_the_cli(patched, capsys):
    (patched / "torch").mkdir()
    (patched / "torch" / "version.py").write_text(TORCH_VERSION_PY.format(cuda="'12.9'", tag="129"))
    assert main(["--target", str(patched), "--no-import", "--expect-cuda", "13"]) == 1
    assert "built for CUDA 12.9" in capsys.readouterr().err
