"""The fleet profile: FLEET_* in .env -> compose override + Prometheus targets, checked by the
real `docker compose config` (offline: no engine) and against the router's own argv."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glmserve.fleet import __main__ as cli
from glmserve.fleet.render import write
from glmserve.fleet.router import FleetError, router_argv
from glmserve.fleet.spec import from_env, targets

ROOT = Path(__file__).resolve().parents[2]
GPU_FLEET = {
    "FLEET_LOCAL_REPLICAS": "0,1,2,3;4,5,6,7",
    "FLEET_REMOTE_WORKERS": "http://10.0.0.5:30000|10.0.0.5:9464,http://10.0.0.6:30000",
    "FLEET_PROFILE": "glm5-nvfp4-b200-tp4",
}
EMULATED = {"FLEET_EMULATED": "1", "FLEET_EMULATED_REPLICAS": "3"}


def compose_config(override: Path, env_file: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLMSERVE_", "COMPOSE_"))}
    env["DOCKER_HOST"] = "unix:///nonexistent-glmserve-test.sock"
    proc = subprocess.run(
        ["docker", "compose", "--project-directory", str(ROOT), "-f", str(ROOT / "compose.yaml"),
         "-f", str(override), "--env-file", str(env_file), "--profile", "fleet",
         "config", "--format", "json"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def env_file(tmp_path: Path, values: dict[str, str]) -> Path:
    path = tmp_path / ".env"
    base = {"GRAFANA_ADMIN_PASSWORD": "test", "MODEL_DIR": str(tmp_path)}
    path.write_text("".join(f"{k}={v}\n" for k, v in {**base, **values}.items()))
    return path


@pytest.fixture
def gpu_fleet(tmp_path, compose_cli):
    spec = from_env(GPU_FLEET)
    compose, _ = write(spec, tmp_path / ".fleet", "test")
    return spec, compose_config(compose, env_file(tmp_path, GPU_FLEET)), tmp_path / ".fleet"


def test_local_replicas_get_their_own_gpus_port_and_profile(gpu_fleet):
    _, config, _ = gpu_fleet
    services = config["services"]
    for name, gpus, port in (("replica-0", "0123", 30001), ("replica-1", "4567", 30002)):
        s = services[name]
        (devices,) = [s["deploy"]["resources"]["reservations"]["devices"]]
        assert devices == [{"capabilities": ["gpu"], "driver": "nvidia", "device_ids": list(gpus)}]
        assert s["environment"]["GLMSERVE_TP"] == "4"
        assert s["environment"]["GLMSERVE_PORT"] == str(port)
        assert s["environment"]["GLMSERVE_PROFILE"] == "glm5-nvfp4-b200-tp4"
        assert s["profiles"] == ["fleet"]
        # Inherited from compose.yaml's sglang service, not restated here.
        assert s["ipc"] == "host" and s["ulimits"]["memlock"] == -1 and s["network_mode"] == "host"
        assert f"127.0.0.1:{port}/health" in s["healthcheck"]["test"][-1]


def test_the_router_is_loopback_pinned_and_in_front_of_every_worker(gpu_fleet):
    spec, config, _ = gpu_fleet
    router = config["services"]["router"]
    assert router["command"] == router_argv(spec.router, spec.worker_urls, "python")
    argv = router["command"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert argv[argv.index("--worker-urls") + 1 :] == [
        "http://127.0.0.1:30001", "http://127.0.0.1:30002",
        "http://10.0.0.5:30000", "http://10.0.0.6:30000",
    ]  # fmt: skip
    assert router["image"].endswith("smg1.13.0") and router["pull_policy"] == "build"
    assert router["build"]["target"] == "router"
    assert {k: v["condition"] for k, v in router["depends_on"].items()} == {
        "replica-0": "service_healthy", "replica-1": "service_healthy"
    }  # fmt: skip
    # The worker's model path exists in the router: its tokenizer loads from disk, not the Hub.
    assert [v["target"] for v in router["volumes"]] == ["/model"]
    assert "/readiness" in router["healthcheck"]["test"][-1]


def test_one_exporter_per_worker_and_none_for_the_router(gpu_fleet):
    spec, config, fleet_dir = gpu_fleet
    services = config["services"]
    # remote-0 brings its own exporter (after '|'); remote-1 gets one here.
    assert {s for s in services if s.startswith("exporter")} == {
        "exporter-replica-0", "exporter-replica-1", "exporter-remote-1"
    }  # fmt: skip
    cmd = services["exporter-remote-1"]["command"]
    assert "--target=http://10.0.0.6:30000" in cmd
    assert any(a.startswith("--web.listen-address=127.0.0.1:") for a in cmd)
    assert services["exporter-replica-0"]["environment"]["GLMSERVE_BUILD_INFO"].endswith(
        "replica-0.json"
    )
    # Prometheus scrapes the same set, each labelled with the URL the router uses.
    files = {p.name: json.loads(p.read_text()) for p in (fleet_dir / "targets").glob("*.json")}
    assert files == targets(spec)
    worker_labels = [t["labels"]["worker"] for t in files["workers.json"]]
    assert worker_labels == spec.worker_urls
    assert [t["labels"]["worker"] for t in files["exporters.json"]] == spec.worker_urls
    assert "10.0.0.5:9464" in [t["targets"][0] for t in files["exporters.json"]]
    prom = services["prometheus"]
    assert "--config.file=/etc/prometheus/prometheus-fleet.yml" in prom["command"]
    assert not [a for a in prom["command"] if "lifecycle" in a]  # no /-/quit for local processes
    assert "/etc/prometheus-fleet" in [v["target"] for v in prom["volumes"]]


def test_the_emulated_fleet_runs_without_gpus(tmp_path, compose_cli):
    spec = from_env(EMULATED)
    compose, _ = write(spec, tmp_path / ".fleet", "test")
    services = compose_config(compose, env_file(tmp_path, EMULATED))["services"]
    replicas = [s for s in services if s.startswith("replica-")]
    assert len(replicas) == 3
    for name in replicas:
        s = services[name]
        assert s["command"][:3] == ["python", "-m", "glmserve.emulator"]
        assert "--model-path=/model" in s["command"]
        assert not s.get("deploy", {}).get("resources", {}).get("reservations")
    assert "sglang" not in services and "emulator" not in services
    assert "exporter" not in services  # the single-server exporter stays out of a fleet


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({}, "the fleet has no workers"),
        ({"FLEET_LOCAL_REPLICAS": "0,1;1,2"}, "GPU 1 is in replica 0 and 1"),
        ({"FLEET_LOCAL_REPLICAS": "0,x"}, "is not GPU ids"),
        ({"FLEET_REMOTE_WORKERS": "10.0.0.5:30000"}, "must look like http://HOST:PORT"),
        ({"FLEET_REMOTE_WORKERS": "http://h:1|nope"}, "exporter 'nope' must be HOST:PORT"),
        ({"FLEET_LOCAL_REPLICAS": "0", "FLEET_WORKER_BASE_PORT": "30000"}, "port 30000 is used"),
        ({"FLEET_LOCAL_REPLICAS": "0", "ROUTER_POLICY": "fastest"}, "not one of"),
        # Three replicas from 65535 would listen on 65535-65537.
        ({**EMULATED, "FLEET_WORKER_BASE_PORT": "65535"}, r"ports 65535-65537 \(3 ports\)"),
        ({"FLEET_LOCAL_REPLICAS": "0", "FLEET_EXPORTER_BASE_PORT": "70000"}, "1-65535"),
        ({"FLEET_LOCAL_REPLICAS": "0", "ROUTER_METRICS_PORT": "0"}, "ROUTER_METRICS_PORT=0"),
        ({"FLEET_LOCAL_REPLICAS": "0", "FLEET_EXPORTER_BASE_PORT": "29000"}, "port 29000"),
    ],
)
def test_bad_fleet_input_is_one_line(env, fragment):
    with pytest.raises(FleetError, match=fragment) as info:
        from_env(env)
    assert "\n" not in str(info.value)


def test_the_cli_writes_both_and_refuses_bad_input_with_exit_2(tmp_path, capsys):
    good = env_file(tmp_path, {"FLEET_LOCAL_REPLICAS": "0"})
    assert cli.main(["compose", "--env-file", str(good), "--out-dir", str(tmp_path / "f")]) == 0
    assert (tmp_path / "f" / "compose.yaml").read_text().startswith("# Generated by")
    assert "docker compose -f compose.yaml -f" in capsys.readouterr().out
    bad = env_file(tmp_path, {"FLEET_LOCAL_REPLICAS": "0;0"})
    proc = subprocess.run(
        [sys.executable, "-m", "glmserve.fleet", "compose", "--env-file", str(bad),
         "--out-dir", str(tmp_path / "g")], capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "GPU 0 is in replica 0 and 1" in proc.stderr
    assert not (tmp_path / "g").exists()


def test_the_cli_reads_env_as_compose_does(tmp_path, capsys):
    """Through glmserve.envfile (python-dotenv), the doctor's reader: an inline comment after
    a value, `export NAME=`, quotes; and a line that is not NAME=VALUE is one line, exit 2."""
    env = tmp_path / "fleet.env"
    env.write_text(
        "FLEET_EMULATED=1 # on\n"
        'FLEET_EMULATED_REPLICAS="2" # two\n'
        "export ROUTER_METRICS_PORT=29123\n"
    )
    out = tmp_path / "f"
    assert cli.main(["compose", "--env-file", str(env), "--out-dir", str(out)]) == 0
    assert "replica-1: http://127.0.0.1:30002 (emulated)" in capsys.readouterr().out
    router = json.loads((out / "targets" / "router.json").read_text())
    assert router[0]["targets"] == ["127.0.0.1:29123"]
    env.write_text("FLEET_EMULATED=1\nnot an assignment\n")
    assert cli.main(["compose", "--env-file", str(env), "--out-dir", str(tmp_path / "g")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "glmserve.fleet: error: fleet.env:2: not NAME=VALUE: 'not an assignment'"


def test_a_refused_run_leaves_the_previous_files_untouched(tmp_path):
    """Everything is validated before anything is written: a refusal once rewrote targets/
    (workers on ports 65535-65537) while compose.yaml kept the old ports."""
    out = tmp_path / ".fleet"
    good = env_file(tmp_path, EMULATED)
    assert cli.main(["compose", "--env-file", str(good), "--out-dir", str(out)]) == 0
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    for bad in ({"FLEET_WORKER_BASE_PORT": "65535"}, {"FLEET_EXPORTER_BASE_PORT": "70000"}):
        env = env_file(tmp_path, {**EMULATED, **bad})
        assert cli.main(["compose", "--env-file", str(env), "--out-dir", str(out)]) == 2
        assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before, bad


def test_the_readme_default_out_dir_resolves_as_docker_compose_resolves_it(tmp_path, compose_cli):
    """As a new user runs it: `python -m glmserve.fleet compose` in the checkout (default
    --out-dir .fleet), then `docker compose -f compose.yaml -f .fleet/compose.yaml`. The
    targets bind must be the folder just written (a `.lstrip("./")` once made it fleet/targets:
    an empty root-owned folder, and a Prometheus with no targets)."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copy(ROOT / "compose.yaml", checkout)
    env_file(checkout, EMULATED)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLMSERVE_", "COMPOSE_"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    env["DOCKER_HOST"] = "unix:///nonexistent-glmserve-test.sock"
    made = subprocess.run([sys.executable, "-m", "glmserve.fleet", "compose"], cwd=checkout,
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert made.returncode == 0, made.stderr
    proc = subprocess.run(
        ["docker", "compose", "-f", "compose.yaml", "-f", ".fleet/compose.yaml",
         "--profile", "fleet", "config", "--format", "json"],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    volumes = json.loads(proc.stdout)["services"]["prometheus"]["volumes"]
    (mount,) = [v for v in volumes if v["target"] == "/etc/prometheus-fleet"]
    assert Path(mount["source"]) == checkout / ".fleet" / "targets"
    assert {p.name for p in Path(mount["source"]).iterdir()} >= {"workers.json", "router.json"}
    assert not (checkout / "fleet").exists()
