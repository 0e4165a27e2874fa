"""The committed TPOT dashboard and Grafana provisioning, checked without a Grafana server."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from glmserve.dashboard import grafana as dashboard


def walk_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every query panel, including those inside (collapsed) rows."""
    out = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


ROOT = Path(__file__).resolve().parents[2]
MON = ROOT / "monitoring"
DASHBOARD = MON / "grafana" / "dashboards" / "tpot.json"
RULES = MON / "prometheus" / "rules"


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def recorded_names() -> set[str]:
    names = set()
    for path in RULES.glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names.update(r["record"] for r in group["rules"] if "record" in r)
    return names


def test_committed_json_is_the_generator_output():
    """Regenerate with: python -m glmserve.dashboard --output <path>."""
    assert DASHBOARD.read_text() == dashboard.render()
    assert dashboard.main(["--check", str(DASHBOARD)]) == 0


def test_check_mode_reports_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "tpot.json"
    stale.write_text(dashboard.render().replace('"TPOT"', '"TPOT (edited)"', 1))
    assert dashboard.main(["--check", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err


def test_no_merge_markers_or_crlf_in_monitoring_files():
    for path in MON.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".yml", ".yaml"):
            text = path.read_text()
            assert "\r" not in text, path
            for marker in ("<<<<<<<", ">>>>>>>", "\n=======\n"):
                assert marker not in text, f"merge marker in {path}"


def test_datasource_is_a_variable_never_a_uid():
    d = load()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in walk_panels(d):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    uids = re.findall(r'"uid":\s*"([^"]*)"', DASHBOARD.read_text())
    assert set(uids) == {dashboard.UID, "${datasource}"}


def test_schema_is_sane():
    d = load()
    assert d["uid"] and d["title"] == "TPOT" and isinstance(d["schemaVersion"], int)
    rows = [p for p in d["panels"] if p["type"] == "row"]
    ids = [p["id"] for p in [*rows, *walk_panels(d)]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for row in rows:
        g = row["gridPos"]
        assert (g["x"], g["w"], g["h"]) == (0, 24, 1) and row["title"], row
        cells |= {(x, g["y"]) for x in range(24)}
    for p in walk_panels(d):
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        area = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & area, f"panel {p['title']!r} overlaps another"
        cells |= area
        assert p["type"] in ("timeseries", "stat")
        assert p["description"], f"{p['title']} needs a description"
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["expr"].strip() and "\n" not in t["expr"]


def test_issue_panels_are_present():
    titles = " | ".join(p["title"] for p in walk_panels(load()))
    for needle in ("TPOT p50/p90/p99 - canary", "TPOT - server side", "ITL", "TTFT",
                   "Output tokens/s", "Running and queued", "KV cache tokens: used vs pool",
                   "SLO attainment", "Build / patch status"):  # fmt: skip
        assert needle in titles, needle


def test_itl_and_tpot_definitions_are_in_the_descriptions():
    panels = {p["title"]: p for p in walk_panels(load())}
    itl = next(p for t, p in panels.items() if t.startswith("ITL"))
    assert "inter-token latency" in itl["description"] and "gap/k" in itl["description"]
    tpot = next(p for t, p in panels.items() if t.startswith("TPOT p50"))
    assert "(output_tokens - 1)" in tpot["description"]


def test_recording_rules_used_by_the_dashboard_exist():
    names = recorded_names()
    used = set()
    for p in walk_panels(load()):
        for t in p["targets"]:
            used.update(re.findall(r"\bglmserve:[a-z0-9_:]+", t["expr"]))
    assert used, "the dashboard should read recording rules"
    assert used <= names, used - names


def test_the_fleet_row_has_a_line_per_replica_and_the_router():
    """Collapsed (a single server has no fleet series); every replica panel is by worker."""
    (row,) = [p for p in load()["panels"] if p["type"] == "row"]
    assert row["title"] == dashboard.FLEET_ROW and row["collapsed"] is True
    titles = [p["title"] for p in row["panels"]]
    for needle in ("Replicas: TPOT", "Replicas: output tokens/s", "Replicas: queued",
                   "Replicas: KV pool", "Replicas: up", "Router: requests/s",
                   "Router: request latency", "Router: retries", "Router: worker health"):  # fmt: skip
        assert any(t.startswith(needle) for t in titles), needle
    for p in row["panels"]:
        if p["title"].startswith("Replicas"):
            assert all("{{worker}}" in t["legendFormat"] for t in p["targets"]), p["title"]


def test_provisioning_files():
    ds = yaml.safe_load((MON / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://127.0.0.1:9090"
    prov = yaml.safe_load((MON / "grafana/provisioning/dashboards/glmserve.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    # compose.yaml mounts monitoring/grafana/dashboards here.
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
