"""The real Host adapters: finding SGLang without importing it, and the self-test wrapper that
turns a crash into a refusal instead of a pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from glmserve.launch import host as host_mod
from glmserve.selftest import runner
from glmserve.selftest.runner import SelfTestReport


def test_sglang_site_is_found_without_importing_it(tmp_path: Path, monkeypatch):
    pkg = tmp_path / "sglang"
    pkg.mkdir()
    # Importing this would raise: find_spec must not execute it.
    (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert host_mod.sglang_site() == tmp_path


def test_selftest_crash_counts_as_failed(monkeypatch):
    def boom(timeout_s: float) -> SelfTestReport:
        raise RuntimeError("CUDA error: illegal instruction")

    monkeypatch.setattr(runner, "run_selftest", boom)
    status, detail, native, timing = host_mod.run_selftest({})
    assert status == "failed" and "RuntimeError: CUDA error" in detail and native == ""
    assert timing == {}


@pytest.mark.parametrize("status", ["passed", "skipped", "failed"])
def test_selftest_report_is_passed_through(monkeypatch, status):
    timing = {"faster": "native", "native_us": [1.0], "gather_us": [2.0]}
    monkeypatch.setattr(
        runner,
        "run_selftest",
        lambda timeout_s: SelfTestReport(status, "why", "passed: ok", timing),
    )
    assert host_mod.run_selftest({}) == (status, "why", "passed: ok", timing)
