"""The self-test through the class, on the CPU: the REAL patched backend file (from the real
wheel, patched by the real apply tool) and the REAL gather kernel (Triton interpreter), driven
by the harness the GPU self-test uses, with FlashInfer and SGLang's imports stood in for
(sglang_standins.py). It passes on the shipped series of each line it drives (0.5.12.post1, and
0.5.17 through its runtime-context API with the real runtime context and DCP helpers) and
refuses wrong wirings that the GPU run would see as wrong numbers: the harness tests the wiring,
not only the kernel."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from support.backend_mutants import OBSERVABLE, WRONG, mutate, observable  # noqa: E402
from support.sglang_standins import (  # noqa: E402
    BACKEND_REL,
    BASE_REL,
    GATHER_REL,
    RUNTIME_RELS,
    cpu_parts,
)

from glmserve.preflight.verify import FA_BACKEND_REL  # noqa: E402
from glmserve.selftest.classcheck import (  # noqa: E402
    SMALL,
    BackendApi,
    RuntimeContextApi,
    WiringFailure,
    backend_api,
    run_class_checks,
)
from glmserve.series import apply  # noqa: E402
from glmserve.series.wheels import extract_site, fetch_wheel  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("Triton was imported before TRITON_INTERPRET=1 could be set")
    site = extract_site(
        fetch_wheel("0.5.12.post1"), tmp_path_factory.mktemp("site"), [BACKEND_REL, BASE_REL]
    )
    assert apply(site, REPO / "patches").action == "applied"
    return site


@pytest.fixture(scope="module")
def site_0_5_17(tmp_path_factory) -> Path:
    """0.5.17's tree: the patched files, the base class, and the runtime context and DCP
    modules its backend plans through (RUNTIME_RELS), all from the real wheel."""
    members = [BACKEND_REL, BASE_REL, FA_BACKEND_REL, *RUNTIME_RELS]
    site = extract_site(fetch_wheel("0.5.17"), tmp_path_factory.mktemp("site-0.5.17"), members)
    assert apply(site, REPO / "patches").action == "applied"
    return site


def checks(site: Path, backend_file: Path, runtime_site: Path | None = None) -> list[str]:
    parts = cpu_parts(backend_file, site / GATHER_REL, site / BASE_REL, runtime_site)
    return run_class_checks(torch, parts, geometry=SMALL, seed=3)


EVERY_CASE = [
    f"auto, {mode} decode: {case}"
    for mode in ("native", "gather")
    for case in (
        "eager decode",
        "paged extend",
        "target verify",
        "CUDA-graph decode emulated",
        "CUDA-graph target verify emulated",
    )
]


def test_the_shipped_wiring_passes_every_case(site):
    lines = checks(site, site / BACKEND_REL)
    assert [line.split(" (")[0] for line in lines] == EVERY_CASE


def test_the_0_5_17_wiring_passes_every_case(site_0_5_17):
    site = site_0_5_17
    lines = checks(site, site / BACKEND_REL, site)
    assert [line.split(" (")[0] for line in lines] == EVERY_CASE


def test_each_line_is_driven_through_its_own_api(site, site_0_5_17):
    """0.5.12.post1 through its capture / replay entry points and server args; 0.5.17 through
    the runtime context and init_forward_metadata_out_graph (which 0.5.12.post1 lacks)."""
    old = cpu_parts(site / BACKEND_REL, site / GATHER_REL, site / BASE_REL)
    new = cpu_parts(
        site_0_5_17 / BACKEND_REL, site_0_5_17 / GATHER_REL, site_0_5_17 / BASE_REL, site_0_5_17
    )
    assert backend_api(old.backend) is BackendApi and old.api is BackendApi
    assert backend_api(new.backend) is RuntimeContextApi and new.api is RuntimeContextApi
    old_class, new_class = (
        old.backend.FlashInferMLAAttnBackend,
        new.backend.FlashInferMLAAttnBackend,
    )
    assert not hasattr(old_class, "init_forward_metadata_out_graph")
    assert not hasattr(new_class, "init_forward_metadata_capture_cuda_graph")
    # Each API replaces exactly the module globals its line reads its configuration through.
    args = SimpleNamespace(
        disaggregation_mode="null", disable_chunked_prefix_cache=True,
        flashinfer_mla_disable_ragged=True,
    )  # fmt: skip
    for api, parts, other in ((BackendApi, old, new), (RuntimeContextApi, new, old)):
        names = set(api.settings(args))
        assert names and all(hasattr(parts.backend, n) for n in names), names
        assert not any(hasattr(other.backend, n) for n in names), names


@pytest.mark.parametrize("name", OBSERVABLE)
def test_a_wrong_wiring_is_refused(site, tmp_path, name):
    (mutant,) = [m for m in WRONG if m.name == name]
    broken = tmp_path / "flashinfer_mla_backend.py"
    broken.write_text(mutate((site / BACKEND_REL).read_text(), mutant))
    with pytest.raises(WiringFailure, match=r"differs from the upstream cast|off fp64|ran 0 times"):
        checks(site, broken)


@pytest.mark.parametrize("name", OBSERVABLE)
def test_a_wrong_0_5_17_wiring_is_refused(site_0_5_17, tmp_path, name):
    (mutant,) = [m for m in observable("0.5.17") if m.name == name]
    broken = tmp_path / "flashinfer_mla_backend.py"
    broken.write_text(mutate((site_0_5_17 / BACKEND_REL).read_text(), mutant))
    with pytest.raises(WiringFailure, match=r"differs from the upstream cast|off fp64|ran 0 times"):
        checks(site_0_5_17, broken, site_0_5_17)


def test_the_class_checks_say_which_lines_they_drive(patched_tree):
    """0.5.12.post1's and 0.5.17's trees are driven; 0.5.23's (its backend API reorganised
    again, and it cannot run on the lab GPU) is named as not ported, so the self-test refuses
    there in one line, never crashes."""
    from glmserve.selftest.classcheck import CLASS_CHECK_SERIES, patched_series, unported_line

    for line in ("0.5.12.post1", "0.5.17"):
        assert patched_series(patched_tree(line) / BACKEND_REL) == line
        assert unported_line(patched_tree(line) / BACKEND_REL) is None
    why = unported_line(patched_tree("0.5.23") / BACKEND_REL)
    assert why is not None and "patched with series 0.5.23" in why and "\n" not in why
    assert "0.5.23" not in CLASS_CHECK_SERIES
