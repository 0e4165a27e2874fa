"""The startup self-test: it passes on the shipped kernel and CATCHES a wrong one.

On the CPU the self-test's checks run the shipped kernel under Triton's interpreter with a plain
torch MLA attention as the oracle (FlashInfer needs a GPU; tests/gpu runs the real thing).
Fault injection: mutated copies of the shipped kernel (off-by-one index, a dropped column
block, a skipped last tile) must each be reported as a failure.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from support.mla_reference import reference_mla_attention  # noqa: E402

from glmserve.selftest import runner  # noqa: E402
from glmserve.series import apply  # noqa: E402
from glmserve.series.wheels import extract_site, fetch_wheel  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BACKEND = "sglang/srt/layers/attention/flashinfer_mla_backend.py"
KERNEL = "sglang/srt/layers/attention/fp8_kv_gather.py"


@pytest.fixture(scope="module")
def kernel_source(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Source of fp8_kv_gather.py from a 0.5.12.post1 tree patched by the real apply tool."""
    site = extract_site(fetch_wheel("0.5.12.post1"), tmp_path_factory.mktemp("site"), [BACKEND])
    assert apply(site, REPO / "patches").action == "applied"
    return (site / KERNEL).read_text()


def load(tmp_path: Path, source: str, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return runner.load_kernel_module(path)


def checks(module) -> list[str]:
    attention = reference_mla_attention(torch, 1.0 / math.sqrt(256))
    return runner.run_checks(
        torch, module, attention, device=torch.device("cpu"), pool_rows=48, heads=2, seed=11
    )


def test_checks_pass_on_the_shipped_kernel(kernel_source, tmp_path):
    lines = checks(load(tmp_path, kernel_source, "shipped"))
    assert len(lines) == 5
    assert any("N > pool" in line for line in lines)
    assert any("duplicates" in line for line in lines)


# Each mutation must match the shipped source exactly once, so a kernel rewrite that makes a
# mutation stale fails here instead of silently testing nothing.
MUTATIONS = {
    "off-by-one index": ("tl.load(idx_ptr + pos,", "tl.load(idx_ptr + pos + 1,"),
    "tail columns dropped": (
        "mask=mask_b)\n        tile += nprog",
        "mask=mask_b & (cols_b[None, :] < 0))\n        tile += nprog",
    ),
    "last tile skipped": (
        "count)\n    n_tiles = tl.cdiv(limit, BLOCK_R)",
        "count)\n    n_tiles = limit // BLOCK_R",
    ),
    "full-pool switch inverted": ("full = count >= n_pool_rows", "full = count > n_pool_rows * 2"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_checks_catch_a_wrong_kernel(kernel_source, tmp_path, mutation):
    old, new = MUTATIONS[mutation]
    assert kernel_source.count(old) == 1, f"mutation {mutation!r} no longer matches the kernel"
    broken = load(tmp_path, kernel_source.replace(old, new), "broken")
    with pytest.raises(runner.SelfTestFailure):
        checks(broken)


def test_skipped_visibly_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("GLMSERVE_FP8_GATHER", raising=False)
    report = runner.run_selftest(timeout_s=5)
    assert report.status == "skipped"
    assert "no CUDA GPU" in report.detail
    assert report.ok


def test_switch_off_skips_and_junk_fails(monkeypatch):
    monkeypatch.setenv("GLMSERVE_FP8_GATHER", "0")
    assert runner.run_selftest().status == "skipped"
    monkeypatch.setenv("GLMSERVE_FP8_GATHER", "perhaps")
    report = runner.run_selftest()
    assert report.status == "failed"
    assert "GLMSERVE_FP8_GATHER" in report.detail


def test_cli_exit_codes():
    """`python -m glmserve.selftest` exits 0 on skipped (no GPU here), 1 on failed."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("GLMSERVE_FP8_GATHER", None)
    skipped = subprocess.run(
        [sys.executable, "-m", "glmserve.selftest"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert skipped.returncode == 0, skipped.stderr
    assert "SKIPPED" in skipped.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "glmserve.selftest"],
        env={**env, "GLMSERVE_FP8_GATHER": "x"},
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert "FAILED" in bad.stdout


def test_a_gpu_without_hardware_e4m3_is_skipped_with_the_reason(monkeypatch, capsys):
    """The child sees the GPU: below 8.9 it reports 'skipped' (the patched SGLang turns the
    gather off there and serves with the upstream cast) instead of failing to compile."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert runner._child(None, 0) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out.startswith("GLMSERVE-SELFTEST-RESULT ")
    report = runner.json.loads(out.split(" ", 1)[1])
    assert report == {
        "status": "skipped",
        "detail": runner.capability_note(8, 0),
        "native": "",
        "timing": {},
    }
    assert "8.0 has no hardware FP8 e4m3 convert" in report["detail"]


def test_the_timing_shape_comes_from_the_launcher_and_bad_values_are_refused():
    """Heads per rank and decode batches: the launcher's values, deduplicated and sorted; the
    defaults without them; one clear error for anything but positive integers."""
    from glmserve.selftest import pathtiming
    from glmserve.switches import SwitchError

    assert pathtiming.requested_shape({}) == (16, (1, 16))
    env = {"GLMSERVE_SELFTEST_HEADS": "8", "GLMSERVE_SELFTEST_DECODE_BATCHES": "64,1,64"}
    assert pathtiming.requested_shape(env) == (8, (1, 64))
    for bad in ({"GLMSERVE_SELFTEST_HEADS": "0"}, {"GLMSERVE_SELFTEST_HEADS": "8,16"},
                {"GLMSERVE_SELFTEST_DECODE_BATCHES": "1,x"},
                {"GLMSERVE_SELFTEST_DECODE_BATCHES": ""}):  # fmt: skip
        with pytest.raises(SwitchError, match="GLMSERVE_SELFTEST_"):
            pathtiming.requested_shape(bad)
    # The faster path is the one with the smaller total over the timed batches; ties: native.
    assert pathtiming.faster_path([10.0, 70.0], [17.0, 150.0]) == "native"
    assert pathtiming.faster_path([10.0, 200.0], [17.0, 150.0]) == "gather"
    assert pathtiming.faster_path([5.0], [5.0]) == "native"
    line = pathtiming.summary({"heads": 8, "context": 2048, "batches": [1, 64],
                               "native_us": [10.0, 66.0], "gather_us": [17.0, 155.0],
                               "faster": "native"})  # fmt: skip
    assert line.startswith("8 heads, 2048 tokens per request, per layer: batch 1: native 10.0 µs")
    # Under MTP the launcher passes the verify pass's query tokens; without it, none.
    assert pathtiming.requested_verify_tokens({}) == 0
    assert pathtiming.requested_verify_tokens({"GLMSERVE_SELFTEST_VERIFY_TOKENS": "4"}) == 4
    with pytest.raises(SwitchError, match="GLMSERVE_SELFTEST_VERIFY_TOKENS"):
        pathtiming.requested_verify_tokens({"GLMSERVE_SELFTEST_VERIFY_TOKENS": "4,5"})
    line = pathtiming.summary({"heads": 8, "context": 2048, "batches": [1, 64],
                               "native_us": [10.0, 66.0], "gather_us": [17.0, 155.0],
                               "verify_tokens": 4, "verify_native_us": [11.0, 70.0],
                               "verify_gather_us": [18.0, 160.0], "faster": "native"})  # fmt: skip
    assert "verify 64x4: native 70.0 µs, gather 160.0 µs; faster: native" in line
    assert line.endswith("faster: native")
