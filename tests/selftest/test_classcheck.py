"""The self-test through the class, on the CPU: the REAL patched backend file (from the real
wheel, patched by the real apply tool) and the REAL gather kernel (Triton interpreter), driven
by the harness the GPU self-test uses, with FlashInfer and SGLang's imports stood in for
(sglang_standins.py). It passes on the shipped series and refuses wrong wirings that the GPU run
would see as wrong numbers: the harness tests the wiring, not only the kernel."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from support.backend_mutants import OBSERVABLE, WRONG, mutate  # noqa: E402
from support.sglang_standins import BACKEND_REL, BASE_REL, GATHER_REL, cpu_parts  # noqa: E402

from glmserve.selftest.classcheck import SMALL, WiringFailure, run_class_checks  # noqa: E402
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


def checks(site: Path, backend_file: Path) -> list[str]:
    parts = cpu_parts(backend_file, site / GATHER_REL, site / BASE_REL)
    return run_class_checks(torch, parts, geometry=SMALL, seed=3)


def test_the_shipped_wiring_passes_every_case(site):
    lines = checks(site, site / BACKEND_REL)
    assert [line.split(" (")[0] for line in lines] == [
        f"auto, {mode} decode: {case}"
        for mode in ("native", "gather")
        for case in ("eager decode", "paged extend", "target verify", "CUDA-graph decode emulated")
    ]


@pytest.mark.parametrize("name", OBSERVABLE)
def test_a_wrong_wiring_is_refused(site, tmp_path, name):
    (mutant,) = [m for m in WRONG if m.name == name]
    broken = tmp_path / "flashinfer_mla_backend.py"
    broken.write_text(mutate((site / BACKEND_REL).read_text(), mutant))
    with pytest.raises(WiringFailure, match=r"differs from the upstream cast|off fp64|ran 0 times"):
        checks(site, broken)


def test_the_class_checks_say_which_lines_they_drive(patched_tree):
    """0.5.12.post1's tree is driven; 0.5.17's and 0.5.23's (their backend API reorganised)
    are named as not ported, so the self-test refuses there in one line, never crashes."""
    from glmserve.selftest.classcheck import CLASS_CHECK_SERIES, unported_line

    backend = "sglang/srt/layers/attention/flashinfer_mla_backend.py"
    assert unported_line(patched_tree("0.5.12.post1") / backend) is None
    for line in ("0.5.17", "0.5.23"):
        why = unported_line(patched_tree(line) / backend)
        assert why is not None and f"patched with series {line}" in why
        assert line not in CLASS_CHECK_SERIES
