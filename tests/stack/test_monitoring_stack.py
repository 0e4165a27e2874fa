"""Monitoring in the compose stack: emulator + exporter + Prometheus (with our rules), a little
load, and the recording rules must land on the emulator's configured TPOT (within 5 %)."""

from __future__ import annotations

import math
import threading
import time

import pytest
from support.stack import EMULATOR_TPOT_MS, Stack

from glmserve.streaming import StreamError, StreamRequest, time_stream

pytestmark = pytest.mark.stack

TOLERANCE = 0.05


def _load(url: str, seconds: float, users: int = 4) -> list[int]:
    """Closed-loop chat streams, so the server-side histograms see traffic besides the canary."""
    counts = [0, 0]  # done, failed
    deadline = time.monotonic() + seconds

    def user() -> None:
        while time.monotonic() < deadline:
            try:
                time_stream(url, StreamRequest(max_tokens=32), timeout_s=30)
                counts[0] += 1
            except StreamError:
                counts[1] += 1

    threads = [threading.Thread(target=user, daemon=True) for _ in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 40)
    return counts


def _value(stack: Stack, expr: str, timeout_s: float = 90) -> float:
    """Poll until `expr` has one finite value (rules need a couple of evaluations)."""
    deadline = time.monotonic() + timeout_s
    last: list = []
    while time.monotonic() < deadline:
        last = stack.prom_query(expr)
        if len(last) == 1 and math.isfinite(float(last[0]["value"][1])):
            return float(last[0]["value"][1])
        time.sleep(1)
    pytest.fail(f"{expr!r} gave no single finite value in {timeout_s:.0f}s: {last}", pytrace=False)


def test_recording_rules_reproduce_the_configured_tpot(emulated_stack: Stack) -> None:
    assert "exporter" in emulated_stack.services, "the exporter is not part of the stack"
    done, failed = _load(emulated_stack.sglang_url, seconds=12)
    assert done > 0 and failed == 0
    # Enough canary requests (one per 2 s in this stack) for the quantiles to be about them.
    _value(emulated_stack, "glmserve_canary_tpot_seconds_count >= 5")
    expected = EMULATOR_TPOT_MS / 1000
    got = {}
    for q in ("0.5", "0.9", "0.99"):
        got[f"canary p{q}"] = _value(
            emulated_stack, f'glmserve:canary_tpot_seconds:quantile5m{{quantile="{q}"}}'
        )
    got["server mean"] = _value(emulated_stack, "glmserve:sglang_tpot_seconds:mean1m")
    print(
        f"TPOT from the recording rules (configured {expected * 1000:g} ms): "
        + ", ".join(f"{k} {v * 1000:.3f} ms" for k, v in got.items())
    )
    off = {k: v for k, v in got.items() if abs(v - expected) > TOLERANCE * expected}
    assert not off, f"outside {expected * 1000:g} ms +-5 %: {got}"


def test_exporter_reports_the_emulator_build(emulated_stack: Stack) -> None:
    value = _value(emulated_stack, "glmserve_target_up")
    assert value == 1
    (info,) = emulated_stack.wait_for_series("glmserve_server_info")
    assert info["metric"]["build_source"] == "emulator"
    assert info["metric"]["kv_cache_dtype"].startswith("fp8")
