"""The committed metric list is what the 0.5.12.post1 wheel defines (when a wheel is at hand).

Uses a wheel already in .cache/wheels/ or downloads it with pip; skips when offline (the
network is not a provisioned prerequisite, so this is a plain skip, not require()).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.sglang_reference import COLLECTOR_PATH, extract, extract_from_wheel, wheel_member

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "wheels"
DATA = Path(__file__).parent / "data" / "sglang-0.5.12.post1-metrics.json"


@pytest.fixture(scope="module")
def wheel() -> Path:
    found = sorted(CACHE.glob("sglang-0.5.12.post1-*.whl"))
    if not found:
        CACHE.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.11", "-d", str(CACHE), "sglang==0.5.12.post1"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        found = sorted(CACHE.glob("sglang-0.5.12.post1-*.whl"))
        if r.returncode != 0 or not found:
            pytest.skip(f"no sglang 0.5.12.post1 wheel (offline?): {r.stderr.strip()[-200:]}")
    return found[0]


def test_committed_reference_equals_the_wheel(wheel):
    committed = json.loads(DATA.read_text())["metrics"]
    assert extract_from_wheel(wheel) == committed


def test_base_label_sets_are_the_wheels(wheel):
    """The label dicts the scheduler and the tokenizer manager build for their collectors."""
    sched = wheel_member(wheel, "sglang/srt/observability/scheduler_metrics_mixin.py")
    tok = wheel_member(wheel, "sglang/srt/managers/tokenizer_manager.py")
    for key in ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"):
        assert f'"{key}":' in sched
    for key in ("model_name", "engine_type"):
        assert f'"{key}":' in tok


def test_extractor_reads_label_additions_and_buckets():
    src = """
class TokenizerMetricsCollector:
    def __init__(self, labels):
        b = [0.5, 1]
        self.a = Histogram(name="sglang:x_seconds", labelnames=labels.keys(), buckets=b)
        self.c = Counter(name="sglang:y_total", labelnames=list(labels.keys()) + ["mode"])
        self.g = Gauge(name="sglang:z", labelnames=labels.keys())
"""
    recs = {r["name"]: r for r in extract(src)}
    assert recs["sglang:x_seconds"]["buckets"] == [0.5, 1.0]
    assert recs["sglang:y_total"]["labelnames"] == ["model_name", "engine_type", "mode"]
    assert recs["sglang:z"]["multiprocess_mode"] == "all"
    assert COLLECTOR_PATH.endswith("metrics_collector.py")
