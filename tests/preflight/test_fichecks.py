"""The FlashInfer check finds BatchMLAPagedAttentionWrapper in the pinned and in newer package
layouts, and checks the attribute run() really reads, not merely one that is set somewhere."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from glmserve.preflight.fichecks import wrapper_read_problems

PINNED_FLASHINFER = "0.6.11.post1"  # what sglang 0.5.12.post1 pins
NEWER_FLASHINFER = "0.7.2"  # run() hands over to per-backend classes in mla/_batch_mla/
WANT = {"_kv_indices_buf"}


@pytest.fixture(scope="module")
def flashinfer(wheel_tree):
    def get(version: str) -> Path:
        return wheel_tree("flashinfer-python", version, "flashinfer/mla") / "flashinfer"

    return get


def test_the_pinned_flashinfer_run_reads_the_gathered_indices(flashinfer):
    fi = flashinfer(PINNED_FLASHINFER)
    assert (fi / "mla" / "_core.py").is_file()
    assert wrapper_read_problems(fi, WANT) == []
    (problem,) = wrapper_read_problems(fi, {"_kv_indptr_buf"})
    assert "run() never reads '_kv_indptr_buf'" in problem  # run() uses the host plan instead


def test_a_newer_flashinfer_names_the_backends_whose_run_ignores_the_buffer(flashinfer):
    fi = flashinfer(NEWER_FLASHINFER)
    assert (fi / "mla" / "_batch_mla" / "_wrapper.py").is_file()
    (problem,) = wrapper_read_problems(fi, WANT)
    assert "hands over to the planned backend's run_from_wrapper()" in problem
    blind = problem.split("), and ")[1].split(" never read")[0].split(", ")
    assert "_BatchMLAPagedAttentionTrtllmGenBackend" in blind
    assert "_BatchMLAPagedAttentionXqaBackend" in blind
    # fa2/fa3 read the wrapper's buffer (through their shared base class): not listed.
    assert not [b for b in blind if "Fa2" in b or "Fa3" in b]


def _fake(root: Path, rel: str, source: str) -> Path:
    path = root / "flashinfer" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return root / "flashinfer"


SET_BUT_NOT_READ = """
    class BatchMLAPagedAttentionWrapper:
        def __init__(self, kv_indices):
            self._kv_indices_buf = kv_indices
            self._kv_indices = kv_indices

        def plan(self, kv_indices):
            self._kv_indices = kv_indices

        def run(self, q):
            return self._module.run(q, self._kv_indices)
"""
READ_THROUGH_A_HELPER = """
    import typing

    class BatchMLAPagedAttentionWrapper:
        @typing.overload
        def run(self, q: int) -> int: ...

        def run(self, q):
            return self._launch(q)

        def _launch(self, q):
            return self._module.run(q, self._kv_indices_buf)
"""


@pytest.mark.parametrize("rel", ["mla.py", "mla/_core.py", "mla/_batch_mla/_wrapper.py"])
def test_an_attribute_that_is_set_but_not_read_by_run_is_refused(tmp_path, rel):
    fi = _fake(tmp_path, rel, SET_BUT_NOT_READ)
    (problem,) = wrapper_read_problems(fi, WANT)
    assert "run() never reads '_kv_indices_buf'" in problem


def test_a_read_through_a_helper_method_counts_and_overload_stubs_are_skipped(tmp_path):
    fi = _fake(tmp_path, "mla/_core.py", READ_THROUGH_A_HELPER)
    assert wrapper_read_problems(fi, WANT) == []


def test_a_handover_without_mirroring_the_buffer_back_is_refused(tmp_path):
    fi = _fake(
        tmp_path,
        "mla/_batch_mla/_wrapper.py",
        """
        class _Backend:
            def run_from_wrapper(self, q):
                return self._module.run(q, self._kv_indices_buf)

        class BatchMLAPagedAttentionWrapper:
            def plan(self):
                self._planned = _Backend()

            def run(self, q):
                planned = self._planned
                return planned.run_from_wrapper(q)
        """,
    )
    (problem,) = wrapper_read_problems(fi, WANT)
    assert "never copies it back into the wrapper" in problem


def test_no_wrapper_class_is_a_problem(tmp_path):
    (tmp_path / "flashinfer").mkdir()
    assert wrapper_read_problems(tmp_path / "flashinfer", WANT) == [
        f"FlashInfer at {tmp_path / 'flashinfer'}: BatchMLAPagedAttentionWrapper not found in "
        "mla.py / mla/"
    ]
