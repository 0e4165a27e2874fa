"""The Locust suite in its container (compose's `locust` service, tools image) against the
containerized emulator: host networking, 127.0.0.1 only, headless, report on a host folder."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from support.stack import EMULATOR_TPOT_MS, EMULATOR_TTFT_MS, Stack

pytestmark = pytest.mark.stack


def test_headless_locust_in_its_container_measures_the_emulator(emulated_stack: Stack) -> None:
    report = Path(tempfile.mkdtemp(prefix="glmserve-locust-"))
    report.chmod(0o777)  # the container runs as uid 10001
    proc = emulated_stack.compose(
        "--profile", "loadtest", "run", "--rm", "--no-deps",
        "-v", f"{report}:/report",
        "locust",
        "locust", "-f", "/opt/glmserve-app/loadtest/decode.py", "--headless",
        "-H", emulated_stack.sglang_url, "--shape", "concurrent", "-u", "4",
        "--warmup-s", "1", "--measure-s", "4", "--max-tokens", "32",
        "--report-dir", "/report", "--slo-tpot-ms", "1000", "--only-summary",
        check=False, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((report / "summary.json").read_text())
    step = summary["steps"][0]
    assert step["requests"] > 0 and not summary["failures_total"]
    assert step["tpot_ms"]["p50"] == pytest.approx(EMULATOR_TPOT_MS, rel=0.10)
    assert step["ttft_ms"]["p50"] >= EMULATOR_TTFT_MS  # a lower bound the emulator guarantees
    assert summary["server"]["sglang_version"]
    assert summary["slo"]["passed"] is True
    assert (report / "latency_histograms.png").exists()
