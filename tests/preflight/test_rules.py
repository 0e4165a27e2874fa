"""The backend rules on data flow: the shipped wiring passes, every hand-made wrong one is refused
by the rule that names the mistake, other correct wirings pass, and the plan-site rule finds
every plan of a newer SGLang (plain-function plans included)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from support.backend_mutants import RIGHT, WRONG, Mutant, mutate

from glmserve.preflight.rules import PLAN_ROWS, check_backend
from glmserve.preflight.verify import BACKEND_REL
from glmserve.series import apply

REPO = Path(__file__).resolve().parents[2]
PINNED = "0.5.12.post1"
NEWER = "0.5.23"


@pytest.fixture(scope="module")
def shipped(pristine_site, tmp_path_factory) -> str:
    """The real 0.5.12.post1 backend after the real apply tool ran the committed series."""
    import shutil

    site = tmp_path_factory.mktemp("rules-site")
    shutil.copytree(pristine_site(PINNED), site, dirs_exist_ok=True)
    assert apply(site, REPO / "patches").action == "applied"
    return (site / BACKEND_REL).read_text()


def problems(source: str) -> list[str]:
    return [
        p.render("flashinfer_mla_backend.py") for p in check_backend(ast.parse(source)).problems
    ]


def test_the_shipped_backend_passes_every_rule(shipped):
    report = check_backend(ast.parse(shipped))
    assert report.problems == []
    assert report.wrapper_attrs == {"_kv_indices_buf"}
    assert len(report.run_sites) == 2  # forward_decode and the paged forward_extend
    assert len(report.plan_sites) == 3  # decode eager + replay, paged prefill


@pytest.mark.parametrize("mutant", WRONG, ids=[m.name for m in WRONG])
def test_a_wrong_wiring_is_refused_by_its_rule(shipped, mutant: Mutant):
    found = problems(mutate(shipped, mutant))
    hits = [p for p in found if f"[{mutant.rule}]" in p and mutant.needle in p]
    assert hits, "\n".join(found) or "accepted"


@pytest.mark.parametrize("mutant", RIGHT, ids=[m.name for m in RIGHT])
def test_another_correct_wiring_is_accepted(shipped, mutant: Mutant):
    assert problems(mutate(shipped, mutant)) == []


def test_the_unpatched_pinned_backend_breaks_each_rule(pristine_site):
    source = (pristine_site(PINNED) / BACKEND_REL).read_text()
    found = "\n".join(problems(source))
    for rule in ("structure", "kv-source", "no-full-cast", "plan-rows"):
        assert f"[{rule}]" in found, rule


def _plan_call_lines(source: str) -> set[int]:
    """Test oracle, independent of the rules: lines that call `.plan(` or a module-level
    `fast_mla_*_plan(`, outside the bodies of those plan functions themselves."""
    tree = ast.parse(source)
    impls = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and re.match(r"fast_mla_\w*plan", n.name)
    ]
    inside = {n.lineno for f in impls for n in ast.walk(f) if hasattr(n, "lineno")}
    lines = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and n.lineno not in inside:
            f = n.func
            if (isinstance(f, ast.Attribute) and f.attr == "plan") or (
                isinstance(f, ast.Name) and re.match(r"fast_mla_\w*plan", f.id)
            ):
                lines.add(n.lineno)
    return lines


def test_every_plan_site_of_a_newer_sglang_is_found(wheel_tree):
    """0.5.23 plans through wrapper.plan(...) and through the plain function
    fast_mla_decode_plan(wrapper, ...): each must be a plan site, refused unnoted."""
    tree = wheel_tree("sglang", NEWER, "sglang/srt/layers/attention/flashinfer_mla_backend.py")
    source = (tree / BACKEND_REL).read_text()
    expected = _plan_call_lines(source)
    assert any("fast_mla_decode_plan(" in source.splitlines()[n - 1] for n in expected)
    report = check_backend(ast.parse(source))
    assert report.plan_sites == expected
    refused = {p.line for p in report.problems if p.rule == PLAN_ROWS}
    assert refused == expected


def test_paths_through_a_replay_flag_are_kept_apart():
    """The same test on the same value later takes the same branch: a note that covers the
    host indptr only when replaying covers the replay plan and not the eager one."""
    src = """
from sglang.srt.layers.attention.fp8_kv_gather import G

class U:
    def __init__(self):
        self.g = G.create()

    def begin(self, w, kv_indptr, replay, host):
        self.g.note_rows(host if replay else kv_indptr)
        if replay:
            w.plan(0, host)
        else:
            w.plan(0, kv_indptr)

    def wrong(self, w, kv_indptr, replay, host):
        self.g.note_rows(host if replay else kv_indptr)
        if not replay:
            w.plan(0, host)
"""
    report = check_backend(ast.parse(src))
    plan_lines = sorted(p.line for p in report.problems if p.rule == PLAN_ROWS)
    wrong_plan = len(src[: src.rindex("w.plan(0, host)")].splitlines())
    assert plan_lines == [wrong_plan], report.problems


def test_a_file_with_too_many_paths_is_refused_not_guessed():
    branches = "".join(f"        if c{i}:\n            x = {i}\n" for i in range(13))
    src = (
        "from sglang.srt.layers.attention.fp8_kv_gather import G\n\n"
        "class U:\n    def begin(self, w, kv_indptr, "
        + ", ".join(f"c{i}" for i in range(13))
        + "):\n"
        + branches
        + "        w.plan(0, kv_indptr)\n"
    )
    found = problems(src)
    assert any(
        "[structure] cannot analyse the file: U.begin has more than 4096 paths" in p for p in found
    ), found
