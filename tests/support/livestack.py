"""A real monitoring stack on loopback for tests: emulator + exporter + Prometheus + load.

Prometheus runs the shipped scrape jobs and rule files (monitoring/prometheus/), rewritten only
for free ports and 1 s intervals. Also runnable as a script to render the committed preview:

    PYTHONPATH=tests .venv/bin/python -m support.livestack --seconds 150 \
        --output docs/img/dashboard-preview.png
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from glmserve.exporter.cli import Exporter, start
from glmserve.exporter.config import ExporterConfig
from glmserve.streaming import StreamError, StreamRequest, time_stream
from glmserve.testing.emulator import RunningEmulator, start_process
from support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "monitoring" / "prometheus"


def start_emulator(port: int, args: Sequence[str], timeout_s: float = 30.0) -> RunningEmulator:
    """The emulator CLI on a FIXED port (so a restart comes back where the exporter looks)."""
    return start_process(args, port=port, timeout_s=timeout_s)


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def prometheus_config(targets: dict[str, str], interval: str = "1s") -> dict[str, Any]:
    """monitoring/prometheus/prometheus.yml with test ports, test intervals, absolute rules."""
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    config["global"].update(
        scrape_interval=interval, evaluation_interval=interval, scrape_timeout=interval
    )
    config["rule_files"] = [str(PROM_DIR / "rules" / "*.yml")]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == set(targets), f"scrape jobs changed: {sorted(jobs)}"
    for name, job in jobs.items():
        job.pop("scrape_timeout", None)
        job.pop("scrape_interval", None)
        # compose writes the file_sd targets at start (compose.yaml's prometheus service);
        # here the test's own addresses are the targets.
        job.pop("file_sd_configs", None)
        job["static_configs"] = [{"targets": [targets[name]]}]
    return config


class Prometheus:
    def __init__(
        self,
        binary: str,
        targets: dict[str, str],
        workdir: Path,
        port: int,
        config: dict[str, Any] | None = None,
    ) -> None:
        """`config` replaces the one derived from prometheus.yml and `targets` (fleet tests)."""
        self.url = f"http://127.0.0.1:{port}"
        cfg = workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config or prometheus_config(targets)))
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start; see {workdir / 'prometheus.log'}")
            time.sleep(0.2)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        resp = httpx.get(self.url + "/api/v1/query", params=params, timeout=10)
        body = resp.json()
        if body.get("status") != "success":
            raise AssertionError(f"query failed: {expr!r}: {body}")
        return body["data"]["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        params = {"query": expr, "start": start, "end": end, "step": step}
        body = httpx.get(self.url + "/api/v1/query_range", params=params, timeout=30).json()
        if body.get("status") != "success":
            raise AssertionError(f"range query failed: {expr!r}: {body}")
        return body["data"]["result"]

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


@dataclass
class Load:
    """Closed-loop streaming clients; `users` can change while running (a load shape)."""

    target: str
    users: int = 4
    max_tokens: int = 32
    done: int = 0
    failed: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self, max_users: int = 32) -> Load:
        for i in range(max_users):
            t = threading.Thread(target=self._run, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _run(self, index: int) -> None:
        request = StreamRequest(max_tokens=self.max_tokens, prompt=f"load user {index}")
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                if index >= self.users:
                    self._stop.wait(0.2)
                    continue
                try:
                    time_stream(self.target, request, client=client, timeout_s=30)
                    self.done += 1
                except StreamError:
                    self.failed += 1
                    self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(35)


@dataclass
class LiveStack:
    emulator: RunningEmulator
    emulator_url: str
    exporter: Exporter
    prometheus: Prometheus
    load: Load
    started_at: float
    workdir: Path


# MTP on (acceptance 2.5 of 4), so the MTP panel and rules have their series as well.
EMULATOR_ARGS = ("--tpot-ms", "20", "--ttft-ms", "100", "--max-concurrency", "12",
                 "--cost-model", "patched", "--speculative-accept-length", "2.5")  # fmt: skip


@contextlib.contextmanager
def live_stack(
    prometheus_binary: str,
    workdir: Path,
    emulator_args: Sequence[str] = EMULATOR_ARGS,
    users: int = 4,
) -> Iterator[LiveStack]:
    emu_port, exp_port, prom_port = free_port(), free_port(), free_port()
    build_info = workdir / "build-info.json"
    emulator = start_emulator(emu_port, [*emulator_args, "--build-info-file", str(build_info)])
    emulator_url = f"http://127.0.0.1:{emu_port}"
    exporter = prometheus = load = None
    try:
        exporter = start(
            ExporterConfig(
                target=emulator_url,
                listen_address=f"127.0.0.1:{exp_port}",
                canary_interval_s=1.0,
                canary_max_tokens=16,
                canary_timeout_s=20.0,
                build_info_file=str(build_info),
            )
        )
        targets = {
            "sglang": f"127.0.0.1:{emu_port}",
            "glmserve-exporter": f"127.0.0.1:{exp_port}",
            "prometheus": f"127.0.0.1:{prom_port}",
        }
        prometheus = Prometheus(prometheus_binary, targets, workdir, prom_port)
        load = Load(emulator_url, users=users).start()
        yield LiveStack(emulator, emulator_url, exporter, prometheus, load, time.time(), workdir)
    finally:
        if load is not None:
            load.stop()
        if prometheus is not None:
            prometheus.stop()
        if exporter is not None:
            exporter.stop()
        emulator.stop()


def dashboard_queries(fleet: bool = False) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of the committed dashboard, Grafana vars filled:
    the top-level panels, or (fleet=True) those of the collapsed fleet row, which need a
    router and `worker` labels (tests/fleet/test_fleet_monitoring.py)."""
    import json

    d = json.loads((ROOT / "monitoring/grafana/dashboards/tpot.json").read_text())
    rows = [p for p in d["panels"] if p["type"] == "row"]
    chosen = [p for r in rows for p in r["panels"]] if fleet else d["panels"]
    out = []
    for panel in chosen:
        for target in panel.get("targets", []):
            # Grafana's $__rate_interval is >= 4 scrape intervals; 1m is what our 15 s gives.
            out.append((panel["title"], target["expr"].replace("$__rate_interval", "1m")))
    return out


def missing_series(prom: Prometheus, fleet: bool = False) -> list[str]:
    """Queries that return no series, or only non-finite values."""
    bad = []
    for title, expr in dashboard_queries(fleet):
        result = prom.query(expr)
        values = [float(r["value"][1]) for r in result]
        if not result or not all(math.isfinite(v) for v in values):
            bad.append(f"{title}: {expr} -> {values or 'no series'}")
    return bad


def wait_all_series(prom: Prometheus, timeout_s: float = 90.0, fleet: bool = False) -> list[str]:
    deadline = time.monotonic() + timeout_s
    bad = missing_series(prom, fleet)
    while bad and time.monotonic() < deadline:
        time.sleep(1.0)
        bad = missing_series(prom, fleet)
    return bad


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=150.0)
    p.add_argument("--output", required=True)
    p.add_argument("--prometheus", default="prometheus")
    args = p.parse_args(argv)
    from glmserve.dashboard.preview import render_preview

    # A load shape so the preview shows the panels move: 2 -> 8 -> 16 users (> the emulator's
    # 12 slots, so some queue) -> 4.
    stages = [(0.2, 2), (0.45, 8), (0.75, 16), (1.0, 4)]
    with tempfile.TemporaryDirectory() as tmp, live_stack(args.prometheus, Path(tmp), users=2) as s:
        t0 = time.monotonic()
        while (elapsed := time.monotonic() - t0) < args.seconds:
            frac = elapsed / args.seconds
            s.load.users = next(u for f, u in stages if frac <= f)
            time.sleep(1.0)
        bad = missing_series(s.prometheus)
        if bad:
            print("queries without data:", *bad, sep="\n  ", file=sys.stderr)
        end = time.time()
        render_preview(s.prometheus, s.started_at + 5, end, args.output,
                       note=f"emulator {' '.join(EMULATOR_ARGS)}; {args.seconds:g} s of load")  # fmt: skip
        print(f"wrote {args.output}; {s.load.done} requests, {s.load.failed} failed")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
