"""The doctor on what a new user sets: compose's own names, ports that move (and Prometheus
following them), the values of programs we do not ship (Prometheus, Grafana, Locust, image
references), each bad value named once; and a hidden .env of ten mistakes, ten lines."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from test_doctor import REPO, doctor, make_project


def env_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "user.env"
    path.write_text(text)
    return path


EMULATED = ("--profile", "emulated", "emulator", "exporter", "prometheus")


def test_compose_project_name_and_file_are_known_and_read(capsys, tmp_path):
    """docker/demo.sh reads them from .env, and two stacks on one host need them."""
    override = tmp_path / "extra.yaml"
    override.write_text("services:\n  extra:\n    image: busybox:1.37\n    profiles: [emulated]\n")
    env = env_file(
        tmp_path, f"COMPOSE_PROJECT_NAME=second-stack\nCOMPOSE_FILE=compose.yaml:{override}\n"
    )
    rc, lines, _ = doctor(capsys, "--env-file", str(env), *EMULATED, "extra")
    assert (rc, lines) == (0, []), lines  # the service the .env's COMPOSE_FILE adds is known
    rc, lines, _ = doctor(capsys, *EMULATED, "extra")
    assert lines == ["glmserve.doctor: no service 'extra' in the compose files"]  # control
    # COMPOSE_FILE is relative to the project dir, as compose reads it; one it cannot read is
    # the one line (nothing else can be checked without the services).
    env = env_file(tmp_path, "COMPOSE_FILE=compose.yaml:missing.yaml\n")
    rc, lines, _ = doctor(capsys, "--env-file", str(env), *EMULATED)
    assert rc == 1
    (line,) = lines
    assert line.startswith("glmserve.doctor: cannot read ") and line.endswith(
        "/missing.yaml: No such file or directory"
    )


def test_a_bad_project_name_is_named(capsys, tmp_path):
    env = env_file(tmp_path, "COMPOSE_PROJECT_NAME=Second Stack\n")
    rc, lines, _ = doctor(capsys, "--env-file", str(env), *EMULATED)
    assert rc == 1
    assert lines == [
        "glmserve.doctor: COMPOSE_PROJECT_NAME='Second Stack' (user.env:1): project name "
        "'Second Stack' must be lower-case letters, digits, '-' and '_', starting with a letter "
        "or digit (docker compose refuses it)"
    ]


def test_compose_env_files_is_read_as_compose_reads_it(capsys, tmp_path):
    """COMPOSE_ENV_FILES instead of the project's .env (how the stack tests keep a developer's
    .env out), later files winning."""
    project = make_project(tmp_path / "project")
    (project / ".env").write_text("EMULATOR_TPOT_MS=not-read\n")
    first = env_file(tmp_path, "EMULATOR_TPOT_MS=oops\n")
    second = tmp_path / "second.env"
    second.write_text("EMULATOR_TPOT_MS=25\n")
    rc, lines, out = doctor(
        capsys, *EMULATED, environ={"COMPOSE_ENV_FILES": f"{first},{second}"}, project_dir=project
    )
    assert (rc, lines) == (0, []) and "user.env checked; second.env checked" in out


def test_ports_moved_in_env_are_where_prometheus_scrapes(capsys, tmp_path):
    """compose.yaml hands Prometheus its targets from the services' own settings: moving every
    port is clean, and a hand-written fixed target that disagrees is named."""
    moved = "SGLANG_PORT=31000\nEXPORTER_LISTEN=127.0.0.1:9500\nPROMETHEUS_LISTEN=127.0.0.1:9191\n"
    rc, lines, _ = doctor(capsys, "--env-file", str(env_file(tmp_path, moved)), *EMULATED)
    assert (rc, lines) == (0, []), lines

    project = make_project(tmp_path / "project")
    (project / "monitoring").unlink()
    shutil.copytree(REPO / "monitoring", project / "monitoring")
    config_path = project / "monitoring" / "prometheus" / "prometheus.yml"
    config = yaml.safe_load(config_path.read_text())
    for job in config["scrape_configs"]:
        if job["job_name"] == "sglang":
            job.pop("file_sd_configs")
            job["static_configs"] = [{"targets": ["127.0.0.1:30000"]}]
    config_path.write_text(yaml.safe_dump(config))
    env = env_file(tmp_path, moved)
    rc, lines, _ = doctor(capsys, "--env-file", str(env), *EMULATED, project_dir=project)
    assert rc == 1
    assert lines == [
        "glmserve.doctor: prometheus: job sglang scrapes 127.0.0.1:30000 (a fixed target in "
        "prometheus.yml) but the service listens on 127.0.0.1:31000; its metrics would be missing"
    ]
    rc, lines, _ = doctor(capsys, *EMULATED, project_dir=project)
    assert (rc, lines) == (0, [])  # the default port: the fixed target agrees


def test_a_port_every_service_reads_is_named_once(capsys, tmp_path):
    """SGLANG_PORT feeds the emulator, the launcher, the exporter's target and Locust's host:
    one line, not one per reader."""
    rc, lines, _ = doctor(
        capsys, "--env-file", str(env_file(tmp_path, "SGLANG_PORT=99999\n")), *EMULATED
    )
    assert rc == 1
    (line,) = lines
    assert line.startswith("glmserve.doctor: SGLANG_PORT='99999' (user.env:1): ")


def test_an_unknown_profile_is_named_once_not_again_under_model_dir(capsys, tmp_path):
    env = env_file(tmp_path, "GLMSERVE_PROFILE=glm5-nvfp4-rtx\nMODEL_DIR=/nonexistent\n")
    rc, lines, _ = doctor(capsys, "--env-file", str(env), environ={"GRAFANA_ADMIN_PASSWORD": "x"})
    assert rc == 1
    assert [ln for ln in lines if "glm5-nvfp4-rtx'" in ln] == lines[:1]
    assert not any(ln.startswith("glmserve.doctor: MODEL_DIR:") for ln in lines), lines


@pytest.mark.parametrize(
    ("setting", "fragment"),
    [
        ("GRAFANA_PORT=70000", "grafana: http_port '70000' is not in 1-65535"),
        ("GRAFANA_ADDR=not an address", "grafana: http_addr 'not an address' is neither"),
        (
            "PROMETHEUS_RETENTION=forever",
            "--storage.tsdb.retention.time='forever' is not a duration",
        ),
        ("GRAFANA_ANONYMOUS=yes please", "is neither true nor false (Grafana would silently read"),
        (
            "EXPORTER_LISTEN=127.0.0.1:99999",
            "web.listen-address: '127.0.0.1:99999': port '99999' is not in 1-65535",
        ),
        (
            "PROMETHEUS_LISTEN=127.0.0.1",
            "prometheus: --web.listen-address='127.0.0.1': is not HOST:PORT",
        ),
        ("LOCUST_WEB_PORT=abc", "locust: --web-port 'abc' is not a port number"),
        ("LOCUST_FILE=nope.py", "locust: no locustfile 'nope.py' in loadtest/ (there: decode.py)"),
        ("GLMSERVE_PULL_POLICY=sometimes", "pull_policy 'sometimes' is not one of compose's"),
        ("NCCL_P2P_LEVEL=FAST", "NCCL_P2P_LEVEL 'FAST' is not one of NCCL's"),
        ("PATCH_LOCK_SHA256=abc", "must be the 64 hex digits"),
        ("SGLANG_HOST=a b", "host 'a b' is neither an IP address nor a host name"),
        ("GLMSERVE_IMAGE=glmserve/server:latest", "would run whatever :latest is today"),
        ("PROMETHEUS_IMAGE=prom/prometheus", "would run whatever :latest is today"),
    ],
)
def test_values_of_programs_we_do_not_ship_are_checked(capsys, tmp_path, setting, fragment):
    rc, lines, _ = doctor(capsys, "--env-file", str(env_file(tmp_path, setting + "\n")), *EMULATED)
    assert rc == 1
    (line,) = lines
    name = setting.split("=", 1)[0]
    assert line.startswith(f"glmserve.doctor: {name}=") and fragment in line, line


def test_the_demos_hint_pasted_as_one_line_is_refused(capsys, tmp_path):
    """`put in .env: A=x B=y` pasted as printed made one value of both, which passed and
    broke the build with `invalid reference format`."""
    pasted = (
        "TOOLS_BASE_IMAGE=glmserve-ci/python:3.11-bookworm "
        "PROMETHEUS_IMAGE=glmserve-ci/prometheus:2.42-bookworm\n"
    )
    rc, lines, _ = doctor(capsys, "--env-file", str(env_file(tmp_path, pasted)), *EMULATED)
    assert rc == 1
    (line,) = lines
    assert "is not an image reference (docker: invalid reference format)" in line
    good = "TOOLS_BASE_IMAGE=glmserve-ci/python:3.11-bookworm\nPROMETHEUS_IMAGE=glmserve-ci/prometheus:2.42-bookworm\n"
    rc, lines, _ = doctor(capsys, "--env-file", str(env_file(tmp_path, good)), *EMULATED)
    assert (rc, lines) == (0, [])


# Ten mistakes a user makes, one per variable.
TEN_BAD = """\
COMPOSE_PROFILES=emulated
SGLANG_PORT=99999
EXPORTER_LISTEN=127.0.0.1:99999
GRAFANA_PORT=70000
PROMETHEUS_RETENTION=forever
GRAFANA_ANONYMOUS=yes please
GLMSERVE_PROFILE=glm5-nvfp4-rtx
TOOLS_BASE_IMAGE=glmserve-ci/python:3.11-bookworm PROMETHEUS_IMAGE=glmserve-ci/prometheus:2.42-bookworm
GLMSERVE_EXTRA_ARGS='["--mem-fraction-static", "abc"]'
EMULATOR_COST_MODEL=patchd
LOCUST_WEB_PORT=808O
"""


def test_ten_bad_values_are_ten_distinct_lines(capsys, tmp_path):
    rc, lines, out = doctor(
        capsys,
        "--env-file",
        str(env_file(tmp_path, TEN_BAD)),
        *EMULATED,
        environ={"GRAFANA_ADMIN_PASSWORD": "x"},
    )
    assert rc == 1 and out == ""
    assert len(lines) == len(set(lines)) == 10, "\n".join(lines)
    named = sorted(line.split(":", 1)[1].split("=", 1)[0].strip() for line in lines)
    assert named == sorted(ln.split("=", 1)[0] for ln in TEN_BAD.splitlines()[1:])
    assert all(line.count("\n") == 0 and "Traceback" not in line for line in lines)
