"""(c) The PATCHED SGLang FlashInferMLAAttnBackend itself on the GPU (run by bench/device_run.sh).

The self-test's class checks (glmserve.selftest.classcheck) on the installed SGLang and FlashInfer:
eager decode, paged extend with a prefix, target verify, and decode captured once in a CUDA graph
and replayed through SGLang's fast replay plan, with FlashInfer `auto` (fa3 on the H200, what the
server runs) and fa2 (SM120's family), with native FP8 decode (held to fp64) and gather-then-cast
decode (bit for bit), against the same class with GLMSERVE_FP8_GATHER=0. Then fault
injection: wrong wirings of the backend (tests/support/backend_mutants.py, spelled for the
installed line: 0.5.12.post1 or 0.5.17) must be refused, by the harness and by the startup
self-test's --backend, so the self-test is shown to catch a wrong WIRING, not only a wrong kernel.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from support.backend_mutants import OBSERVABLE, mutate, observable  # noqa: E402

from glmserve.selftest import classcheck, runner  # noqa: E402

CHECK_BUDGET_S = 30.0


@pytest.fixture(scope="module")
def parts():
    fmb = pytest.importorskip(classcheck.BACKEND_MODULE)
    if not hasattr(fmb.FlashInferMLAAttnBackend, "_mla_kv_for_wrapper"):
        pytest.fail("the imported SGLang backend is not patched")
    parts = classcheck.installed_parts(torch)
    classcheck.run_class_checks(torch, parts, geometry=classcheck.WARM, seed=1)  # JIT, compiles
    torch.cuda.synchronize()
    return parts


def mutant_for(parts, name: str):
    """The named wrong wiring, spelled for the installed line's patched backend."""
    line = classcheck.patched_series(Path(parts.backend.__file__))
    if line not in classcheck.CLASS_CHECK_SERIES:
        pytest.fail(f"the installed backend's series {line} is not one the class checks drive")
    (mutant,) = [m for m in observable(line) if m.name == name]
    return mutant


def test_c_patched_class_matches_upstream(parts):
    t0 = time.monotonic()
    lines = classcheck.run_class_checks(torch, parts, seed=7)
    torch.cuda.synchronize()
    took = time.monotonic() - t0
    print(f"\n[c] {len(lines)} class checks in {took:.1f} s (JIT excluded): " + "; ".join(lines))
    assert len(lines) == len(classcheck.CASES) * len(parts.flashinfer_backends) * len(
        parts.decode_modes
    )
    assert took < CHECK_BUDGET_S


@pytest.mark.parametrize("name", OBSERVABLE)
def test_c_a_wrong_wiring_is_refused(parts, tmp_path, name):
    mutant = mutant_for(parts, name)
    source = Path(parts.backend.__file__).read_text()
    broken = tmp_path / "flashinfer_mla_backend.py"
    broken.write_text(mutate(source, mutant))
    wrong = classcheck.installed_parts(torch, backend_path=broken)
    wrong.flashinfer_backends = ("auto",)
    with pytest.raises(classcheck.WiringFailure) as caught:
        classcheck.run_class_checks(torch, wrong, seed=7)
    print(f"\n[c, {name}] refused: {caught.value}")


def test_c_the_startup_selftest_refuses_a_wrong_wiring(parts, tmp_path):
    mutant = mutant_for(parts, OBSERVABLE[0])
    broken = tmp_path / "flashinfer_mla_backend.py"
    broken.write_text(mutate(Path(parts.backend.__file__).read_text(), mutant))
    report = runner.run_selftest(timeout_s=CHECK_BUDGET_S, backend_path=str(broken))
    print(f"\n[selftest, {OBSERVABLE[0]}] {report.status}: {report.detail[:300]}")
    assert report.status == "failed"
    assert "wiring is WRONG" in report.detail


def test_c_a_wrong_native_wiring_fails_the_native_verdict_only(parts, tmp_path):
    """Native decode wired wrong: the self-test still passes (gather is proven), its native
    verdict fails, and the launcher then serves with GLMSERVE_FP8_ATTENTION=gather."""
    name = "native decode reads the eager wrapper's indices (stale under CUDA graphs)"
    mutant = mutant_for(parts, name)
    broken = tmp_path / "flashinfer_mla_backend.py"
    broken.write_text(mutate(Path(parts.backend.__file__).read_text(), mutant))
    report = runner.run_selftest(timeout_s=CHECK_BUDGET_S, backend_path=str(broken))
    print(f"\n[selftest, {name}] {report.status}; native {report.native[:300]}")
    assert report.status == "passed", report.detail
    assert report.native.startswith("failed: native FP8 decode wiring is WRONG"), report.native
