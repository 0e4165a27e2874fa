"""GPU proof of the native FP8 decode kernel's start-up check (run on the H200; CI skips).

The self-test's native verdict must pass on the shipped kernel and refuse a deliberately wrong
one (each request missing its last token), while the gather checks still pass: that is the
case in which the launcher serves on the gather path instead. The kernel's numerics against
FlashInfer over the whole workload grid live in bench/fp8_decode.py.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from glmserve.selftest import runner  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def patched_sglang():
    path = runner.installed_kernel_path()
    if path is None or not (path.parent / "fp8_mla_decode.py").is_file():
        pytest.fail("no patched SGLang with fp8_mla_decode.py on sys.path")


def test_native_verdict_passes_on_the_shipped_kernel(monkeypatch):
    monkeypatch.delenv("GLMSERVE_FP8_ATTENTION", raising=False)
    report = runner.run_selftest(timeout_s=30)
    print(f"\n[selftest] {report.status}; native {report.native}")
    assert report.status == "passed", report.detail
    assert report.native.startswith("passed: "), report.native


def test_both_decode_paths_are_timed_at_the_launchers_shape(monkeypatch):
    """Once native passed, both paths are timed on this GPU at the heads and batches the
    launcher passes: one positive µs per batch each, and the faster named."""
    monkeypatch.delenv("GLMSERVE_FP8_ATTENTION", raising=False)
    monkeypatch.setenv("GLMSERVE_SELFTEST_HEADS", "8")
    monkeypatch.setenv("GLMSERVE_SELFTEST_DECODE_BATCHES", "1,64")
    report = runner.run_selftest(timeout_s=60)
    print(f"\n[selftest timing] {report.timing}")
    assert report.status == "passed", report.detail
    t = report.timing
    assert "error" not in t, t
    assert (t["heads"], t["batches"]) == (8, [1, 64])
    assert len(t["native_us"]) == len(t["gather_us"]) == 2
    assert all(v > 0 for v in t["native_us"] + t["gather_us"])
    assert t["faster"] == ("native" if sum(t["native_us"]) <= sum(t["gather_us"]) else "gather")


def test_native_verdict_refuses_an_injected_fault_without_failing_the_gather(monkeypatch):
    monkeypatch.delenv("GLMSERVE_FP8_ATTENTION", raising=False)
    report = runner.run_selftest(timeout_s=30, native_fault="drop-last-token")
    print(f"\n[selftest, native fault] {report.status}; native {report.native[:300]}")
    assert report.status == "passed", report.detail
    assert report.native.startswith("failed: native FP8 decode is WRONG"), report.native


def test_gather_mode_skips_the_native_check(monkeypatch):
    monkeypatch.setenv("GLMSERVE_FP8_ATTENTION", "gather")
    report = runner.run_selftest(timeout_s=30)
    assert report.status == "passed", report.detail
    assert report.native == "skipped: GLMSERVE_FP8_ATTENTION=gather"
    assert report.timing == {}  # nothing to choose between
