"""One TPOT SLO: the exporter's TPOT_SLO_S. The dashboard is generated from it; the Prometheus
rules are YAML that promtool tests, so here every place they state the SLO (the attainment
buckets, the alert thresholds, the ms in their texts and comments) is checked against it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from glmserve.exporter.canary import TPOT_BUCKETS, TPOT_SLO_S

RULES = Path(__file__).resolve().parents[2] / "monitoring" / "prometheus" / "rules"
MS = f"{TPOT_SLO_S * 1000:g}"
LE = f"{TPOT_SLO_S:g}"  # how the exporter's and SGLang's bucket labels spell it


def rules(name: str) -> dict[str, dict]:
    doc = yaml.safe_load((RULES / name).read_text())
    return {r.get("record") or r["alert"]: r for g in doc["groups"] for r in g["rules"]}


def test_the_slo_is_a_bucket_boundary() -> None:
    assert TPOT_SLO_S in TPOT_BUCKETS


def test_attainment_rules_count_the_slo_bucket() -> None:
    found = {n: r for n, r in rules("glmserve-recording.yml").items() if "slo_attainment" in n}
    assert len(found) == 2, sorted(found)
    for name, rule in found.items():
        assert set(re.findall(r'le="([^"]+)"', rule["expr"])) == {LE}, name


def test_alerts_fire_over_the_slo_and_say_so() -> None:
    found = {n: r for n, r in rules("glmserve-alerts.yml").items() if n.endswith("OverSLO")}
    assert len(found) == 2, sorted(found)
    for name, rule in found.items():
        threshold = re.fullmatch(r".*>\s*([0-9.]+)\s*", rule["expr"], re.S)
        assert threshold and float(threshold.group(1)) == TPOT_SLO_S, (name, rule["expr"])
        assert f"{MS} ms SLO" in rule["annotations"]["summary"], name


def test_every_ms_the_rule_files_give_for_the_slo_is_the_slo() -> None:
    for name in ("glmserve-recording.yml", "glmserve-alerts.yml"):
        text = (RULES / name).read_text()
        stated = re.findall(r"SLO \((\d+) ms\)|SLO is (\d+) ms|(\d+) ms SLO|above (\d+) ms", text)
        values = {v for groups in stated for v in groups if v}
        assert values == {MS}, (name, values)


def test_the_load_tests_we_suggest_judge_by_the_same_slo() -> None:
    """The README's Locust commands, and the one `make demo` prints, use the SLO
    the dashboard draws (a run judged at 50 ms beside an SLO line at 40 once told two stories)."""
    root = RULES.parents[2]
    stated = set(re.findall(r"--slo-tpot-ms (\d+)", (root / "README.md").read_text()))
    assert stated == {MS}, stated
    demo = (root / "docker" / "demo.sh").read_text()
    assert "--slo-tpot-ms $slo_ms" in demo and "import TPOT_SLO_S" in demo
    assert not re.findall(r"--slo-tpot-ms \d", demo)
