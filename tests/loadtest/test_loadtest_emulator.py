"""Regression guard for the suite's accuracy: a short headless run against the emulator.

The committed benchmark (bench/loadtest_accuracy.py, bench/results/loadtest-accuracy-*.md)
holds the ±2 % numbers; this test uses looser bounds so a busy CI machine does not flake,
yet still fails if a definition or the read path breaks (a TPOT from chunk counts would be
K = 2 times off, a TTFT stopped at the role-only ack would be near zero, a late body read
would inflate both).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.locust_run import run_locust

from glmserve.testing.emulator import emulator_process

TPOT_MS, TTFT_MS, K = 20.0, 300.0, 2
TPOT_BOUND, TTFT_BOUND = 0.05, 0.10  # relative; the benchmark's bound is 0.02


@pytest.mark.parametrize(("streams", "route"), [(1, "generate"), (16, "chat")])
def test_locust_measures_the_emulator_timing(streams: int, route: str, tmp_path: Path) -> None:
    args = ["--tpot-ms", str(TPOT_MS), "--ttft-ms", str(TTFT_MS), "--tokens-per-chunk", str(K)]
    with emulator_process(args) as emu:
        run = run_locust(emu.url, tmp_path / "rep", "-u", str(streams), "--warmup-s", "2",
                         "--measure-s", "5", "--max-tokens", "48", "--route", route)  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    summary = run.summary
    step = summary["steps"][0]
    assert step["requests"] >= streams
    assert step["output_tokens_per_request"]["p50"] == 48
    assert step["tpot_ms"]["p50"] == pytest.approx(TPOT_MS, rel=TPOT_BOUND)
    assert step["ttft_ms"]["p50"] == pytest.approx(TTFT_MS, rel=TTFT_BOUND)
    # ITL splits each K-token chunk's gap evenly: its median is TPOT, not K x TPOT.
    assert step["itl_ms"]["p50"] == pytest.approx(TPOT_MS, rel=TPOT_BOUND)
    assert step["ack_ms"]["p50"] <= step["ttft_ms"]["p50"]
    server = summary["server"]
    assert server["sglang_version"] == "0.5.12.post1"
    assert server["kv_pool_tokens"] > 0 and server["kv_cache_dtype"]
    assert server["emulator"]["tpot_ms"] == TPOT_MS
