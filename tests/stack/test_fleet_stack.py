"""The generated fleet under Docker: `python -m glmserve.fleet compose` with FLEET_EMULATED=1,
then `docker compose --profile fleet up --wait`: three emulator replicas, one exporter each, the
router built from the Dockerfile's `router` stage, Prometheus on prometheus-fleet.yml. All on
127.0.0.1 with free ports (host network, as in compose.yaml)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.net import free_port
from support.stack import REPO, Stack, Timings, compose_env

from glmserve.fleet.render import write
from glmserve.fleet.spec import from_env
from glmserve.streaming import StreamRequest, time_stream

pytestmark = [pytest.mark.stack, pytest.mark.slow]
REPLICAS = 3


def free_run(n: int) -> int:
    """A base port with n consecutive free ports after it (replicas and exporters count up)."""
    for _ in range(50):
        base = free_port()
        if base + n >= 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def fast_prometheus(dest: Path) -> Path:
    """monitoring/prometheus/ with prometheus-fleet.yml at a 1 s interval."""
    shutil.copytree(REPO / "monitoring" / "prometheus", dest)
    path = dest / "prometheus-fleet.yml"
    config = yaml.safe_load(path.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s", scrape_timeout="1s")
    for job in config["scrape_configs"]:
        for sd in job.get("file_sd_configs", []):
            sd["refresh_interval"] = "1s"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


@pytest.fixture(scope="module")
def fleet_stack(ci_bases, tools_image, stack_timings: Timings) -> Iterator[tuple[Stack, object]]:
    workdir = Path(tempfile.mkdtemp(prefix="glmserve-fleet-"))
    workdir.chmod(0o755)
    router_port, metrics_port, prom_port = free_port(), free_port(), free_port()
    env_vars = {
        "FLEET_EMULATED": "1",
        "FLEET_EMULATED_REPLICAS": str(REPLICAS),
        "FLEET_WORKER_BASE_PORT": str(free_run(REPLICAS)),
        "FLEET_EXPORTER_BASE_PORT": str(free_run(REPLICAS)),
        "SGLANG_PORT": str(router_port),
        "ROUTER_METRICS_PORT": str(metrics_port),
        "ROUTER_POLICY": "round_robin",
    }
    spec = from_env(env_vars)
    generated, _ = write(spec, workdir / "fleet", "test")
    os.chmod(workdir / "fleet" / "targets", 0o755)
    for p in (workdir / "fleet" / "targets").iterdir():
        p.chmod(0o644)
    prom_dir = fast_prometheus(workdir / "prometheus")
    services = [w.name for w in spec.workers] + [f"exporter-{w.name}" for w in spec.workers]
    fast = {"healthcheck": {"interval": "1s"}}
    override = workdir / "compose.fleet-test.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "services": {
                    "prometheus": {
                        "volumes": [f"{prom_dir}:/etc/prometheus:ro", "prometheus-data:/prometheus"]
                    },
                    "router": {"healthcheck": {"interval": "1s", "start_period": "30s"}},
                    **{name: fast for name in services},
                }
            }
        )
    )
    env = compose_env(
        ci_bases,
        **env_vars,
        PROMETHEUS_LISTEN=f"127.0.0.1:{prom_port}",
        EMULATOR_COST_MODEL="off",
        EMULATOR_TPOT_MS="5",
        EMULATOR_TTFT_MS="20",
        EXPORTER_CANARY_INTERVAL="1s",
    )
    env.pop("COMPOSE_PROFILES", None)
    stack = Stack(
        project=f"glmserve-fleet-{os.getpid()}",
        workdir=workdir,
        env=env,
        ports={"sglang": router_port, "prometheus": prom_port, "router_metrics": metrics_port},
        services=[*services, "router", "prometheus"],
        files=[REPO / "compose.yaml", generated, override],
    )
    try:
        with stack_timings.measure("fleet: router image build"):
            stack.compose("--profile", "fleet", "build", "router", timeout=900)
        with stack_timings.measure("fleet: compose up"):
            stack.compose("--profile", "fleet", "up", "-d", "--no-build", "--wait",
                          "--wait-timeout", "150", *stack.services, timeout=300)  # fmt: skip
        yield stack, spec
    finally:
        with stack_timings.measure("fleet: compose down"):
            logs = stack.compose("--profile", "fleet", "logs", "--no-color", check=False)
            (workdir / "compose.log").write_text(logs.stdout + logs.stderr)
            stack.compose("--profile", "fleet", "down", "-v", "--remove-orphans", "-t", "10",
                          check=False)  # fmt: skip
        shutil.rmtree(workdir, ignore_errors=True)


def test_the_router_container_serves_through_every_replica(fleet_stack):
    stack, spec = fleet_stack
    with urllib.request.urlopen(stack.sglang_url + "/readiness", timeout=5) as r:
        ready = json.loads(r.read())
    assert ready["healthy_workers"] == REPLICAS, ready
    timings = [
        time_stream(stack.sglang_url, StreamRequest(max_tokens=8, prompt=f"hi {i}"), timeout_s=30)
        for i in range(2 * REPLICAS)
    ]
    assert all(t.output_tokens == 8 for t in timings)
    with urllib.request.urlopen(stack.sglang_url + "/workers", timeout=5) as r:
        workers = json.loads(r.read())["workers"]
    assert sorted(w["url"] for w in workers) == sorted(spec.worker_urls)


def test_prometheus_scrapes_the_router_every_worker_and_every_exporter(fleet_stack):
    stack, spec = fleet_stack
    urls = set(spec.worker_urls)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = {r["metric"]["worker"] for r in stack.prom_query('up{job="sglang"} == 1')}
        exporters = {r["metric"]["worker"] for r in stack.prom_query("glmserve_target_up == 1")}
        health = {r["metric"]["worker"] for r in stack.prom_query("smg_worker_health == 1")}
        if workers == exporters == health == urls:
            break
        time.sleep(1)
    assert workers == urls and exporters == urls and health == urls, (workers, exporters, health)
    assert stack.prom_query('up{job="router"} == 1')
