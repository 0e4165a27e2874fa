"""Every dashboard query and every recording rule, evaluated by a real Prometheus.

Prometheus (the Debian 2.42 binary) scrapes the emulator and the exporter under load, with the
shipped scrape jobs and rule files; a panel query that returns no series (or NaN) fails.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from support.livestack import PROM_DIR, LiveStack, live_stack, wait_all_series

# ~25 s in all: one stack for the module, most of it waiting for rules to fill.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(prometheus_binary, tmp_path_factory):
    with live_stack(prometheus_binary, tmp_path_factory.mktemp("livestack")) as s:
        yield s


def test_every_dashboard_query_returns_finite_series(stack: LiveStack):
    bad = wait_all_series(stack.prometheus)
    assert not bad, "panel queries without data:\n" + "\n".join(bad)
    assert stack.load.done > 0 and stack.load.failed == 0


def test_every_recording_rule_produces_a_value(stack: LiveStack):
    wait_all_series(stack.prometheus)
    missing = []
    for path in sorted((PROM_DIR / "rules").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            if group["name"].startswith("glmserve-fleet"):
                continue  # need a router and worker labels: tests/fleet/test_fleet_monitoring.py
            for rule in group["rules"]:
                if "record" not in rule:
                    continue
                result = stack.prometheus.query(rule["record"])
                if not result or not all(math.isfinite(float(r["value"][1])) for r in result):
                    missing.append(rule["record"])
    assert not missing, missing


def test_rules_loaded_healthy_and_no_false_alerts(stack: LiveStack):
    """The 'patched' emulator reports FP8 KV with a series and the gather on: no patch alert.

    The firing side (no series, or gather off) is covered by promtool's rule unit tests.
    """
    wait_all_series(stack.prometheus)
    import httpx

    groups = httpx.get(stack.prometheus.url + "/api/v1/rules", timeout=10).json()["data"]
    rules = [r for g in groups["groups"] for r in g["rules"]]
    assert rules and all(r["health"] == "ok" for r in rules), [
        (r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"
    ]
    alerts = {r["name"]: r for r in rules if r["type"] == "alerting"}
    assert alerts["GlmserveFP8KVWithoutPatch"]["state"] == "inactive"
    assert alerts["GlmserveTargetDown"]["state"] == "inactive"
    assert alerts["GlmserveTPOTOverSLO"]["state"] == "inactive"  # 20 ms < 40 ms
    # The emulator's batch never outgrows its graphs by default (cuda_graph_max_bs = its
    # max concurrency): decode passes are all in-graph.
    assert alerts["GlmserveDecodeWithoutCudaGraphs"]["state"] == "inactive"


def test_info_series_describes_the_emulator(stack: LiveStack):
    wait_all_series(stack.prometheus)
    (info,) = stack.prometheus.query("glmserve_server_info")
    labels = info["metric"]
    assert labels["kv_cache_dtype"] == "fp8_e4m3"
    assert labels["build_source"] == "emulator"
    assert labels["patch_series"] == "emulated" and labels["fp8_gather"] == "on"
    assert labels["summary"] == "FP8 KV, patched, MTP 4-token verify, pool 495k"
    assert labels["speculative_algorithm"] == "EAGLE"


def test_mtp_series_follow_the_emulated_acceptance(stack: LiveStack):
    """The emulator accepts 2.5 tokens per verify pass of 4 (steps of 2 and 3): the exporter's
    re-export, the recording rules and the canary's tokens per step all land there."""
    wait_all_series(stack.prometheus)
    (length,) = stack.prometheus.query("glmserve:spec_accept_length:mean5m")
    (rate,) = stack.prometheus.query("glmserve:spec_accept_rate:mean5m")
    (canary,) = stack.prometheus.query("glmserve_canary_tokens_per_step")
    assert 2.0 <= float(length["value"][1]) <= 3.0
    assert 1 / 3 <= float(rate["value"][1]) <= 2 / 3
    assert 2.0 <= float(canary["value"][1]) <= 3.0
    alerts = httpx_rules(stack)
    assert alerts["GlmserveMTPAcceptanceCollapsed"]["state"] == "inactive"


def httpx_rules(stack: LiveStack) -> dict[str, dict]:
    import httpx

    groups = httpx.get(stack.prometheus.url + "/api/v1/rules", timeout=10).json()["data"]
    return {r["name"]: r for g in groups["groups"] for r in g["rules"] if r["type"] == "alerting"}


def test_preview_command_draws_the_live_panels(stack: LiveStack, tmp_path: Path):
    """`python -m glmserve.dashboard.preview --prometheus URL`, the product command, against
    the live Prometheus: a PNG of every time-series panel, none of them empty."""
    import subprocess
    import sys

    from glmserve.dashboard.preview import PrometheusHTTP, preview_figure

    wait_all_series(stack.prometheus)
    out = tmp_path / "preview.png"
    proc = subprocess.run(
        [sys.executable, "-m", "glmserve.dashboard.preview",
         "--prometheus", stack.prometheus.url, "--output", str(out), "--minutes", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {out}")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    import time

    _, empty = preview_figure(PrometheusHTTP(stack.prometheus.url), stack.started_at, time.time())
    assert empty == []
