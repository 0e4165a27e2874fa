"""Preflight: it must pass on the real patched tree and catch every way the wiring can be lost."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from glmserve.patching import MARKER_REL, apply, load_series
from glmserve.patching.udiff import FilePatch, Hunk, apply_file_patch
from glmserve.patching.verify import (
    BACKEND_REL,
    FLASHINFER_WRAPPER,
    GATHER_REL,
    _BackendAnalysis,
    cuda_build_problems,
    main,
    preflight,
)

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
PINNED = "0.5.12.post1"
HAVE_KERNEL_DEPS = all(importlib.util.find_spec(m) for m in ("torch", "triton"))


@pytest.fixture
def patched(make_site) -> Path:
    site = make_site(PINNED)
    assert apply(site, PATCHES).action == "applied"
    return site


def without_marker_noise(problems: list[str]) -> list[str]:
    return [p for p in problems if MARKER_REL not in p]


@pytest.mark.skipif(not HAVE_KERNEL_DEPS, reason="torch and Triton (the kernels extra) needed")
def test_real_patched_tree_passes_including_the_file_import(patched):
    assert preflight(patched, import_gather=True) == []


def test_real_patched_tree_passes_static_checks(patched):
    assert preflight(patched, import_gather=False) == []


def test_unpatched_tree_fails(make_site):
    problems = preflight(make_site(PINNED), import_gather=False)
    text = "\n".join(problems)
    assert "no valid patch marker" in text
    assert "fp8_kv_gather.py: missing" in text
    assert "the gather is not wired in" in text


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


@pytest.mark.skipif(not HAVE_KERNEL_DEPS, reason="torch and Triton (the kernels extra) needed")
def test_gather_module_that_fails_to_import_is_reported(patched):
    target = patched / GATHER_REL
    target.write_bytes(target.read_bytes() + b"\nraise RuntimeError('broken at import')\n")
    problems = without_marker_noise(preflight(patched, import_gather=True))
    assert problems == ["fp8_kv_gather.py: import failed: RuntimeError: broken at import"]


def test_gather_module_missing_an_imported_name_is_reported(patched):
    imported = sorted(_BackendAnalysis(ast.parse((patched / BACKEND_REL).read_bytes())).imported)
    assert imported, "the backend imports nothing from the gather module"
    target = patched / GATHER_REL
    tree = ast.parse(target.read_bytes())
    tree.body = [
        n for n in tree.body if getattr(n, "name", None) != imported[0]
    ]  # drop the definition
    target.write_text(ast.unparse(tree))
    problems = without_marker_noise(preflight(patched, import_gather=False))
    assert f"fp8_kv_gather.py: does not define {imported[0]}, which the backend imports" in problems


# --- the ast rules on small synthetic backends ---------------------------------------------

GOOD = """
import os
from sglang.srt.layers.attention.fp8_kv_gather import Gather

class FlashInferMLAAttnBackend:
    def __init__(self):
        self.g = Gather.create()

    def forward_extend(self, fb, layer, q):
        return self._kv(fb, layer, q)

    def forward_decode(self, fb, layer, q):
        if self.g is not None:
            return self.g.cast(fb.pool.get_key_buffer(layer.layer_id), q.dtype)
        return fb.pool.get_key_buffer(layer.layer_id).to(q.dtype)

    def _kv(self, fb, layer, q):
        pool = fb.pool.get_key_buffer(layer.layer_id)
        return pool.to(q.dtype) if self.g is None else self.g.cast(pool, q.dtype)

class Updater:
    def call_begin_forward(self, wrapper, kv_indptr, replay):
        if self.attn_backend.g is not None:
            self.attn_backend.g.note_rows(kv_indptr)
        if not replay:
            wrapper.plan(kv_indptr)
        else:
            wrapper.plan(kv_indptr, fast=True)

def fast_plan(self, *args):
    self._cached_module.plan(*args)  # not a wrapper: the plan() implementation itself
"""


NOTE = """\
        if self.attn_backend.g is not None:
            self.attn_backend.g.note_rows(kv_indptr)
"""
PLANS = """\
        if not replay:
            wrapper.plan(kv_indptr)
        else:
            wrapper.plan(kv_indptr, fast=True)
"""


def rules(src: str) -> list[str]:
    return _BackendAnalysis(ast.parse(textwrap.dedent(src))).problems()


def test_rules_accept_guarded_casts_and_gather_before_plan():
    assert rules(GOOD) == []


def test_rules_accept_a_module_level_env_switch():
    src = GOOD.replace(
        "class FlashInferMLAAttnBackend:",
        '_ON = os.environ.get("GLMSERVE_FP8_GATHER", "1") != "0"\n\nclass FlashInferMLAAttnBackend:',
    ).replace("if self.g is not None:", "if _ON:")
    assert rules(src) == []


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "        if self.g is not None:\n"
            "            return self.g.cast(fb.pool.get_key_buffer(layer.layer_id), q.dtype)\n",
            "",
            ["forward_decode still casts", "forward_decode never calls the fp8 gather"],
        ),
        (
            "return pool.to(q.dtype) if self.g is None else self.g.cast(pool, q.dtype)",
            "return pool.to(q.dtype)",
            ["forward_extend (via _kv) still casts", "forward_extend never calls"],
        ),
        (
            "if self.g is not None:\n            return self.g.cast",
            "if layer.layer_id > 0:\n            return self.g.cast",
            ["forward_decode still casts"],
        ),
        (
            "pool.to(q.dtype) if self.g is None",
            "pool.bfloat16() if layer is None",
            ["forward_extend (via _kv) still casts"],
        ),
        (
            "self.attn_backend.g.note_rows(kv_indptr)",
            "pass",
            ["call_begin_forward plans a FlashInfer MLA wrapper without updating"] * 2,
        ),
        (  # the row count refreshed only AFTER planning: too late for the replayed graph
            NOTE + PLANS,
            PLANS + NOTE,
            ["call_begin_forward plans a FlashInfer MLA wrapper without updating"] * 2,
        ),
        (
            "from sglang.srt.layers.attention.fp8_kv_gather import Gather",
            "from somewhere_else import Gather",
            ["does not import sglang.srt.layers.attention.fp8_kv_gather"],
        ),
    ],
)
def test_rules_catch_lost_wiring(old, new, expected):
    src = textwrap.dedent(GOOD)
    assert old in src
    problems = rules(src.replace(old, new))
    for needle in set(expected):
        hits = [p for p in problems if needle in p]
        assert len(hits) == expected.count(needle), problems


def test_switch_must_exist_somewhere(patched):
    for rel in (BACKEND_REL, GATHER_REL):
        text = (patched / rel).read_bytes()
        (patched / rel).write_bytes(text.replace(b"GLMSERVE_FP8_GATHER", b"GLMSERVE_OTHER"))
    problems = without_marker_noise(preflight(patched, import_gather=False))
    assert any("GLMSERVE_FP8_GATHER is read nowhere" in p for p in problems)


# --- CLI -------------------------------------------------------------------------------------


def test_cli_exit_codes(patched, make_site, tmp_path, capsys):
    assert main(["--target", str(patched), "--no-import"]) == 0
    assert f"ok: SGLang {PINNED} patched with series {PINNED}" in capsys.readouterr().out
    (patched / MARKER_REL).unlink()
    assert main(["--target", str(patched), "--no-import"]) == 1
    assert "FAIL: no valid patch marker" in capsys.readouterr().err
    assert main(["--target", str(tmp_path / "missing")]) == 2


def test_cli_as_module_runs(patched):
    proc = subprocess.run(
        [sys.executable, "-m", "glmserve.patching.verify", "--target", str(patched), "--no-import"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


# --- FlashInfer internals the patched path relies on ----------------------------------------


def _fake_flashinfer(root: Path, attrs: set[str], layout: str = "package") -> Path:
    body = "".join(f"        self.{a} = kv\n" for a in sorted(attrs)) or "        pass\n"
    src = f"class {FLASHINFER_WRAPPER}:\n    def plan(self, kv):\n{body}"
    pkg = root / "flashinfer"
    if layout == "package":  # flashinfer >= 0.6: flashinfer/mla/_core.py
        (pkg / "mla").mkdir(parents=True)
        (pkg / "mla" / "_core.py").write_text(src)
    else:  # older releases: flashinfer/mla.py
        pkg.mkdir(parents=True)
        (pkg / "mla.py").write_text(src)
    return pkg


@pytest.mark.parametrize("layout", ["package", "module"])
def test_wrapper_attributes_the_patched_path_reads_must_exist(patched, tmp_path, layout):
    """A FlashInfer that no longer sets an attribute read via getattr(..., fallback) would
    silently route every step to the fallback: preflight names each missing attribute."""
    backend = ast.parse((patched / BACKEND_REL).read_bytes())
    attrs = _BackendAnalysis(backend).wrapper_attrs_read()
    good = _fake_flashinfer(tmp_path / "good", attrs, layout)
    assert preflight(patched, import_gather=False, flashinfer=good) == []
    bad = _fake_flashinfer(tmp_path / "bad", {"unrelated"}, layout)
    problems = preflight(patched, import_gather=False, flashinfer=bad)
    assert len(problems) == len(attrs)
    for attr in attrs:
        assert any(f"never sets {attr!r}" in p for p in problems), problems
    assert preflight(patched, import_gather=False, flashinfer=tmp_path) == [
        f"FlashInfer at {tmp_path}: {FLASHINFER_WRAPPER} not found in mla.py / mla/"
    ]


def test_rules_collect_getattr_reads_on_forward_paths():
    src = textwrap.dedent(GOOD).replace(
        "        pool = fb.pool.get_key_buffer(layer.layer_id)\n",
        "        pool = fb.pool.get_key_buffer(layer.layer_id)\n"
        '        idx = getattr(self.wrapper, "_kv_indices_buf", None)\n',
    )
    assert _BackendAnalysis(ast.parse(src)).wrapper_attrs_read() == {"_kv_indices_buf"}
    assert _BackendAnalysis(ast.parse(textwrap.dedent(GOOD))).wrapper_attrs_read() == set()


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
