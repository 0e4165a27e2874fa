"""The fleet row and the fleet rules, evaluated by a real Prometheus scraping the REAL router.

Three emulator processes, one exporter per worker, the router in front, all on 127.0.0.1;
Prometheus runs monitoring/prometheus/prometheus-fleet.yml with the targets written by
glmserve.fleet.render.write (what `python -m glmserve.fleet compose` writes), at 1 s intervals. Then one worker is
killed: the router takes it out, and the dashboard's query and the GlmserveWorkerDown alert
both show that worker.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.fleet import emulator_args, port_of
from support.livestack import PROM_DIR, Load, Prometheus, wait_all_series

from glmserve.fleet.render import write
from glmserve.fleet.router import RouterConfig
from glmserve.fleet.spec import FleetSpec, Worker
from glmserve.serverproc import free_port
from glmserve.testing.emulator import RunningEmulator, start_process
from glmserve.testing.router import RunningRouter, start_router

pytest.importorskip("smg", reason="pip install '.[router]'")
pytestmark = pytest.mark.slow

FAST = {"health_check_interval_s": 1, "health_check_timeout_s": 2, "cb_timeout_s": 2,
        "health_failure_threshold": 2, "worker_startup_check_interval_s": 1}  # fmt: skip


def fleet_config(target_dir: Path) -> dict[str, Any]:
    """prometheus-fleet.yml at test intervals, with absolute rule and target paths."""
    config = yaml.safe_load((PROM_DIR / "prometheus-fleet.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s", scrape_timeout="1s")
    config["rule_files"] = [str(PROM_DIR / "rules" / "*.yml")]
    for job in config["scrape_configs"]:
        for sd in job.get("file_sd_configs", []):
            sd["files"] = [str(target_dir / Path(f).name) for f in sd["files"]]
            sd["refresh_interval"] = "1s"
    return config


@dataclass
class Fleet:
    emulators: list[RunningEmulator]
    router: RunningRouter
    prometheus: Prometheus
    load: Load


@pytest.fixture(scope="module")
def fleet(prometheus_binary, tmp_path_factory) -> Iterator[Fleet]:
    from glmserve.exporter.cli import start as start_exporter
    from glmserve.exporter.config import ExporterConfig

    workdir = tmp_path_factory.mktemp("fleet")
    emus = [start_process(emulator_args(tpot_ms=5, ttft_ms=20)) for _ in range(3)]
    exporters, router, prom, load = [], None, None, None
    try:
        for emu in emus:
            exporters.append(
                start_exporter(
                    ExporterConfig(
                        target=emu.url,
                        listen_address="127.0.0.1:0",
                        canary_interval_s=1.0,
                        canary_max_tokens=8,
                    )
                )
            )
        router = start_router([e.url for e in emus], policy="round_robin", **FAST)
        spec = FleetSpec(
            workers=tuple(
                Worker(f"replica-{i}", e.url, f"127.0.0.1:{x.port}", local=True)
                for i, (e, x) in enumerate(zip(emus, exporters, strict=True))
            ),
            router=RouterConfig(metrics_port=router.config.metrics_port),
        )
        write(spec, workdir, "the test's fleet")
        port = free_port()
        # compose.yaml's prometheus service writes this one at start (PROMETHEUS_LISTEN).
        (workdir / "targets" / "PROMETHEUS.json").write_text(
            f'[{{"targets": ["127.0.0.1:{port}"]}}]\n'
        )
        prom = Prometheus(prometheus_binary, {}, workdir, port, fleet_config(workdir / "targets"))
        load = Load(router.url, users=4, max_tokens=16).start(max_users=4)
        yield Fleet(emus, router, prom, load)
    finally:
        for thing in (load, prom):
            if thing is not None:
                thing.stop()
        if router is not None:
            router.close()
        for x in exporters:
            x.stop()
        for emu in emus:
            emu.stop()


def until(check, timeout_s: float = 20.0) -> Any:
    """Poll `check` until it returns something truthy (Prometheus scrapes every 1 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    return check()


def values(prom: Prometheus, expr: str) -> dict[str, float]:
    """{worker label (or ''): value} of an instant query."""
    return {r["metric"].get("worker", ""): float(r["value"][1]) for r in prom.query(expr)}


def test_every_fleet_panel_query_returns_finite_series(fleet: Fleet):
    bad = wait_all_series(fleet.prometheus, timeout_s=60, fleet=True)
    assert not bad, "fleet panel queries without data:\n" + "\n".join(bad)
    # One line per replica, labelled with the URL the router uses for it.
    urls = {e.url for e in fleet.emulators}
    expr = "glmserve:worker_output_tokens_per_second:rate1m"
    tps = until(lambda: (v := values(fleet.prometheus, expr)).keys() == urls and v)
    assert tps and set(tps) == urls, values(fleet.prometheus, expr)


def test_every_fleet_recording_rule_produces_a_value(fleet: Fleet):
    wait_all_series(fleet.prometheus, timeout_s=60, fleet=True)
    missing = []
    for group in yaml.safe_load((PROM_DIR / "rules" / "glmserve-fleet.yml").read_text())["groups"]:
        for rule in group["rules"]:
            result = fleet.prometheus.query(rule["record"])
            if not result or not all(math.isfinite(float(r["value"][1])) for r in result):
                missing.append(rule["record"])
    assert not missing, missing


def test_a_killed_worker_shows_on_the_dashboard_and_in_the_alert(fleet: Fleet):
    """Runs last in the module: it kills a worker (and brings it back)."""
    wait_all_series(fleet.prometheus, timeout_s=60, fleet=True)
    prom = fleet.prometheus
    victim = fleet.emulators[2]
    os.kill(victim.pid, signal.SIGKILL)
    victim.stop()

    # The dashboard's "Replicas: up" / "Router: worker health" query: the victim at 0.
    health = until(lambda: (v := values(prom, "smg_worker_health")).get(victim.url) == 0 and v)
    assert health and health[victim.url] == 0, health
    assert all(v == 1 for url, v in health.items() if url != victim.url), health
    assert values(prom, 'up{job="sglang", worker!=""}')[victim.url] == 0
    assert until(lambda: values(prom, "glmserve:router_unhealthy_workers:sum").get("") == 1)
    # The alert's expression matches the victim, so the rule is pending (for: 1m; promtool's
    # unit test covers the firing after it).
    pending = until(
        lambda: prom.query('ALERTS{alertname="GlmserveWorkerDown", alertstate="pending"}')
    )
    assert pending and {a["metric"]["worker"] for a in pending} == {victim.url}, pending
    # Retries: the router repeated the requests the dead worker refused on the others (the raw
    # counter: it is born at its first value, so a 1 m rate of it can still read 0 here).
    assert until(lambda: values(prom, "sum(smg_worker_retries_total)").get("", 0) > 0)

    fleet.emulators[2] = start_process(emulator_args(tpot_ms=5, ttft_ms=20),
                                       port=port_of(victim.url))  # fmt: skip
    back = until(lambda: values(prom, "smg_worker_health").get(victim.url) == 1)
    assert back, "the restarted worker did not come back on the dashboard"
    assert until(lambda: not prom.query('ALERTS{alertname="GlmserveWorkerDown"}'))
