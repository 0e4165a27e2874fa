"""The rules on the newer SGLang lines (0.5.17, 0.5.23), on their real wheels: both patched files
pass, both unpatched files are refused where upstream casts the pool, no chained
`get_key_buffer(...).to(...)` survives the series, every hand-made wrong fa3 wiring is refused by
the rule that names it, and the FlashInfer each line pins reads the indices the gather refreshes
for the backends its wrappers plan."""

from __future__ import annotations

import ast

import pytest
from support.backend_mutants import mutate
from support.fa_mutants import FA_RIGHT, FA_WRONG, FI_DCP_WRONG

from glmserve.preflight.farules import check_flashattention_backend, is_flashattention_backend
from glmserve.preflight.fichecks import wrapper_read_problems
from glmserve.preflight.flow import CAST_METHODS, POOL_GETTERS
from glmserve.preflight.rules import check_backend
from glmserve.preflight.verify import BACKEND_REL, FA_BACKEND_REL
from glmserve.preflight.verify import main as verify_main

LINES = ("0.5.17", "0.5.23")
# Where upstream casts the whole pool (FACTS; the files are read from the wheels here).
UPSTREAM_CASTS = {
    "0.5.17": {BACKEND_REL: {598, 660}, FA_BACKEND_REL: {1577, 1976}},
    "0.5.23": {BACKEND_REL: {761, 822}, FA_BACKEND_REL: {1944, 2350}},
}
# What each line pins (its wheel's METADATA), for the FlashInfer check.
FLASHINFER = {"0.5.17": "0.6.15.post1", "0.5.23": "0.7.2"}


def rule_problems(source: str) -> list[str]:
    tree = ast.parse(source)
    if is_flashattention_backend(tree):
        report = check_flashattention_backend(tree)
    else:
        report = check_backend(tree)
    return [p.render("f.py") for p in report.problems]


def chained_casts(source: str) -> set[int]:
    """Test oracle, independent of the rules: lines with `<x>.get_key_buffer(...).to(...)`."""
    lines = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            inner = n.func.value
            if (
                n.func.attr in CAST_METHODS
                and isinstance(inner, ast.Call)
                and isinstance(inner.func, ast.Attribute)
                and inner.func.attr in POOL_GETTERS
            ):
                lines.add(n.lineno)
    return lines


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("rel", [BACKEND_REL, FA_BACKEND_REL])
def test_each_patched_file_passes_and_keeps_no_chained_pool_cast(line, rel, patched_tree):
    source = (patched_tree(line) / rel).read_text()
    assert rule_problems(source) == []
    assert chained_casts(source) == set()


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("rel", [BACKEND_REL, FA_BACKEND_REL])
def test_each_unpatched_file_is_refused_at_upstream_s_casts(line, rel, pristine_site):
    source = (pristine_site(line) / rel).read_text()
    casts = UPSTREAM_CASTS[line][rel]
    assert chained_casts(source) == casts
    found = rule_problems(source)
    refused = {int(p.split(":")[1]) for p in found if "[no-full-cast]" in p}
    assert refused == casts, found
    assert any("[structure] does not import" in p for p in found)


@pytest.mark.parametrize("line", LINES)
def test_rules_only_cli_accepts_patched_and_refuses_pristine(
    line, patched_tree, pristine_site, capsys
):
    for rel in (BACKEND_REL, FA_BACKEND_REL):
        assert verify_main(["--rules-only", str(patched_tree(line) / rel)]) == 0
        assert "ok:" in capsys.readouterr().out
        assert verify_main(["--rules-only", str(pristine_site(line) / rel)]) == 1
        assert "[no-full-cast]" in capsys.readouterr().err


@pytest.fixture(scope="module")
def fa_shipped(patched_tree) -> str:
    return (patched_tree("0.5.17") / FA_BACKEND_REL).read_text()


@pytest.mark.parametrize("mutant", FA_WRONG, ids=[m.name for m in FA_WRONG])
def test_a_wrong_fa3_wiring_is_refused_by_its_rule(fa_shipped, mutant):
    found = rule_problems(mutate(fa_shipped, mutant))
    hits = [p for p in found if f"[{mutant.rule}]" in p and mutant.needle in p]
    assert hits, "\n".join(found) or "accepted"


@pytest.mark.parametrize("mutant", FA_RIGHT, ids=[m.name for m in FA_RIGHT])
def test_another_correct_fa3_wiring_is_accepted(fa_shipped, mutant):
    assert rule_problems(mutate(fa_shipped, mutant)) == []


@pytest.mark.parametrize("mutant", FI_DCP_WRONG, ids=[m.name for m in FI_DCP_WRONG])
def test_a_wrong_port_past_dcp_is_refused_by_its_rule(patched_tree, mutant):
    source = (patched_tree("0.5.17") / BACKEND_REL).read_text()
    found = rule_problems(mutate(source, mutant))
    hits = [p for p in found if f"[{mutant.rule}]" in p and mutant.needle in p]
    assert hits, "\n".join(found) or "accepted"


@pytest.mark.parametrize("line", LINES)
def test_the_pinned_flashinfer_reads_what_the_gather_refreshes(line, patched_tree, wheel_tree):
    fi = wheel_tree("flashinfer-python", FLASHINFER[line], "flashinfer/mla") / "flashinfer"
    report = check_backend(ast.parse((patched_tree(line) / BACKEND_REL).read_text()))
    assert report.wrapper_attrs == {"_kv_indices_buf"}
    assert wrapper_read_problems(fi, report.wrapper_attrs, report.wrapper_backends) == []
    if line == "0.5.23":
        # FlashInfer 0.7: fa2/fa3 named with the series on; "auto" could plan a backend that
        # keeps its own indices, which the check names.
        assert report.wrapper_backends == {"fa2", "fa3"}
        (problem,) = wrapper_read_problems(fi, report.wrapper_attrs, {"auto"})
        assert "_BatchMLAPagedAttentionTrtllmGenBackend" in problem
    else:
        assert report.wrapper_backends == {"auto"}  # 0.6.x: run() itself reads the buffer


def test_the_0_5_23_wrappers_naming_auto_again_fail_the_flashinfer_check(patched_tree, wheel_tree):
    source = (patched_tree("0.5.23") / BACKEND_REL).read_text()
    old = '            return "auto"\n        return self.fp8_gather.wrapper_backend\n'
    assert source.count(old) == 1
    report = check_backend(
        ast.parse(source.replace(old, '            return "auto"\n        return "auto"\n'))
    )
    assert report.problems == [] and report.wrapper_backends == {"auto"}
    fi = wheel_tree("flashinfer-python", "0.7.2", "flashinfer/mla") / "flashinfer"
    assert wrapper_read_problems(fi, report.wrapper_attrs, report.wrapper_backends)
