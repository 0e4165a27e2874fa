"""promtool validates the shipped Prometheus config, rules and rule unit tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

PROM_DIR = Path(__file__).resolve().parents[2] / "monitoring" / "prometheus"


def promtool(binary: str, *args: str, cwd: Path = PROM_DIR) -> subprocess.CompletedProcess:
    return subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_check_config(promtool_binary):
    """prometheus.yml parses and every rule file it globs is valid."""
    proc = promtool(promtool_binary, "check", "config", "prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 rule files found" in proc.stdout


def test_check_rules(promtool_binary):
    rules = sorted(str(p.relative_to(PROM_DIR)) for p in (PROM_DIR / "rules").glob("*.yml"))
    assert rules, "no rule files"
    proc = promtool(promtool_binary, "check", "rules", *rules)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rule_unit_tests(promtool_binary):
    tests = sorted(str(p.relative_to(PROM_DIR)) for p in (PROM_DIR / "tests").glob("*.yml"))
    assert tests, "no rule unit tests"
    proc = promtool(promtool_binary, "test", "rules", *tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rule_unit_tests_catch_a_moved_slo_boundary(promtool_binary, tmp_path):
    """The unit tests bite: an SLO bucket moved from 40 ms to 50 ms makes them fail."""
    shutil.copytree(PROM_DIR, tmp_path / "prometheus")
    recording = tmp_path / "prometheus" / "rules" / "glmserve-recording.yml"
    text = recording.read_text()
    assert 'le="0.04"' in text
    recording.write_text(text.replace('le="0.04"', 'le="0.05"'))
    proc = promtool(
        promtool_binary,
        "test",
        "rules",
        "tests/glmserve-rules.test.yml",
        cwd=tmp_path / "prometheus",
    )
    assert proc.returncode != 0
    assert "slo_attainment" in proc.stdout + proc.stderr
