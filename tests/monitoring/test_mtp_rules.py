"""One MTP acceptance floor: the exporter's SPEC_ACCEPT_LENGTH_FLOOR. The alert's threshold and
the number its texts state are that floor; the rule unit tests (glmserve-mtp.test.yml) bite."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml
from test_prometheus_rules import PROM_DIR, promtool
from test_slo import rules

from glmserve.exporter.info import SPEC_ACCEPT_LENGTH_FLOOR

ALERT = "GlmserveMTPAcceptanceCollapsed"


def test_the_alert_fires_under_the_floor_and_says_so() -> None:
    rule = rules("glmserve-alerts.yml")[ALERT]
    threshold = re.search(r"glmserve:spec_accept_length:mean5m\s*<\s*([0-9.]+)", rule["expr"])
    assert threshold and float(threshold.group(1)) == SPEC_ACCEPT_LENGTH_FLOOR
    assert f"(floor {SPEC_ACCEPT_LENGTH_FLOOR:g})" in rule["annotations"]["summary"]
    # Only where MTP was asked for, and only while requests run.
    assert 'speculative_algorithm!=""' in rule["expr"]
    assert "glmserve:sglang_running_requests:sum > 0" in rule["expr"]


def test_the_recording_rules_read_the_exporters_gauges() -> None:
    found = rules("glmserve-recording.yml")
    assert (
        "glmserve_server_spec_accept_length[5m]"
        in found["glmserve:spec_accept_length:mean5m"]["expr"]
    )
    assert (
        "glmserve_server_spec_accept_rate[5m]" in found["glmserve:spec_accept_rate:mean5m"]["expr"]
    )


@pytest.mark.parametrize("moved_to", ["1.2", "1.8"])
def test_the_unit_tests_catch_a_moved_floor(promtool_binary, tmp_path, moved_to) -> None:
    shutil.copytree(PROM_DIR, tmp_path / "prometheus")
    alerts = tmp_path / "prometheus" / "rules" / "glmserve-alerts.yml"
    doc = yaml.safe_load(alerts.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == ALERT:
                rule["expr"] = rule["expr"].replace("< 1.5", f"< {moved_to}")
                assert moved_to in rule["expr"]
    alerts.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = promtool(promtool_binary, "test", "rules", "tests/glmserve-mtp.test.yml",
                    cwd=tmp_path / "prometheus")  # fmt: skip
    assert proc.returncode != 0
    assert ALERT in proc.stdout + proc.stderr
