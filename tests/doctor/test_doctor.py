"""python -m glmserve.doctor: every typo and bad value of an env file named in one line each,
with the message the component itself gives; profiles; the host (through an injected docker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from glmserve.doctor.__main__ import main
from glmserve.doctor.host import Answer, check_host

REPO = Path(__file__).resolve().parents[2]
FAKE_GLM5 = REPO / "tests" / "fixtures" / "glm5-nvfp4"


def fine_host(needs_gpu: bool) -> tuple[list[str], list[str]]:
    return [], ["docker (test double)"]


def no_gpu_host(needs_gpu: bool) -> tuple[list[str], list[str]]:
    return (["docker: no NVIDIA container runtime"] if needs_gpu else []), []


# What the doctor reads of a checkout; everything else (a developer's own .env above all) stays
# out of the tests' project dirs.
PROJECT_FILES = ("compose.yaml", ".env.example", "monitoring", "loadtest")


def make_project(root: Path) -> Path:
    """A project dir with the checkout's compose.yaml, .env.example, monitoring/ and loadtest/,
    and no .env unless a test writes one."""
    root.mkdir(exist_ok=True)
    for name in PROJECT_FILES:
        (root / name).symlink_to(REPO / name)
    return root


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "project")


def doctor(
    capsys: pytest.CaptureFixture[str],
    *argv: str,
    environ: dict[str, str] | None = None,
    host=fine_host,
    project_dir: Path | None = None,
) -> tuple[int, list[str], str]:
    if project_dir is None:  # a fresh one: the checkout's own .env is never read
        project_dir = make_project(Path(tempfile.mkdtemp(prefix="glmserve-doctor-")))
    rc = main(["--project-dir", str(project_dir), *argv], environ or {}, host)
    out, err = capsys.readouterr()
    return rc, err.splitlines(), out


def env_file(tmp_path: Path, text: str, name: str = ".env") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


HIDDEN = """\
# a user's .env with every kind of mistake
COMPOSE_PROFILES=emulatd
EMULATOR_TPOT_MSS=5
GRAFANA_ADMIN_PASSWROD=s3cret
emulator_ttft_ms=100
EMULATOR_TPOT_MS=2O
EMULATOR_COST_MODEL=patchd
EXPORTER_CANARY_MAX_TOKENS=1
EXPORTER_CANARY_INTERVAL=soon
GLMSERVE_TP=eight
GLMSERVE_FP8_GATHER=yes
GLMSERVE_EXTRA_ARGS='["--tp-size", "8"]'
this line is not an assignment
"""


def test_a_hidden_env_file_gets_one_line_per_typo_and_bad_value(capsys, tmp_path):
    rc, lines, out = doctor(capsys, "--env-file", str(env_file(tmp_path, HIDDEN)))
    assert rc == 1 and out == ""
    assert all(line.startswith("glmserve.doctor: ") for line in lines)
    expected = {
        ".env:3: EMULATOR_TPOT_MSS is not a known name (did you mean EMULATOR_TPOT_MS?)",
        ".env:4: GRAFANA_ADMIN_PASSWROD is not a known name (did you mean GRAFANA_ADMIN_PASSWORD?)",
        ".env:5: emulator_ttft_ms is not a known name (did you mean EMULATOR_TTFT_MS?)",
        ".env:13: not NAME=VALUE",
        "COMPOSE_PROFILES: compose profile 'emulatd' does not exist (did you mean emulated?)",
        "EMULATOR_TPOT_MS='2O' (.env:6): python -m glmserve.emulator: error: argument --tpot-ms",
        "EMULATOR_COST_MODEL='patchd' (.env:7): python -m glmserve.emulator: error: argument "
        "--cost-model: invalid choice: 'patchd'",
        "EXPORTER_CANARY_MAX_TOKENS='1' (.env:8): glmserve-exporter: error: canary.max-tokens: "
        "must be 2..4096",
        "EXPORTER_CANARY_INTERVAL='soon' (.env:9): glmserve-exporter: error: flag: "
        "canary.interval: not a duration",
        "GLMSERVE_TP='eight' (.env:10): glmserve.launch: error: TP must be an integer",
        "GLMSERVE_FP8_GATHER='yes' (.env:11): glmserve.launch: error: GLMSERVE_FP8_GATHER='yes' "
        "must be 1",
        'GLMSERVE_EXTRA_ARGS=\'["--tp-size", "8"]\' (.env:12): glmserve.launch: error: extra '
        "SGLang arg --tp-size is set by the launcher itself",
    }
    for fragment in expected:
        assert sum(fragment in line for line in lines) == 1, (fragment, lines)
    # Nothing else, except what follows from the bad profile: no server among the profiles,
    # and Grafana (in every profile) without a password.
    rest = [ln for ln in lines if not any(f in ln for f in expected)]
    assert len(rest) == 2 and "no server would start" in rest[0] and "GRAFANA" in rest[1], rest
    assert "s3cret" not in "\n".join(lines)


def _component_stderr(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )
    assert proc.returncode != 0
    (line,) = proc.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize(
    ("setting", "component"),
    [
        (("EMULATOR_TPOT_MS", "2O"), (["glmserve.emulator", "--tpot-ms=2O", "--ttft-ms=250"], {})),
        (
            ("EXPORTER_CANARY_INTERVAL", "soon"),
            (["glmserve.exporter", "--canary.interval=soon"], {}),
        ),
        (
            ("GLMSERVE_TP", "eight"),
            (
                ["glmserve.launch", "--dry-run", "--model-path", "/model"],
                {"GLMSERVE_TP": "eight", "GLMSERVE_PROFILE": "glm5-nvfp4-rtxpro6000-tp8"},
            ),
        ),
        (
            ("GLMSERVE_PROFILE", "glm5-nvfp4-rtx"),
            (["glmserve.launch", "--dry-run"], {"GLMSERVE_PROFILE": "glm5-nvfp4-rtx"}),
        ),
    ],
    ids=["emulator", "exporter", "launcher-tp", "launcher-profile"],
)
def test_a_bad_value_gets_the_components_own_message(capsys, tmp_path, setting, component):
    """The doctor's line ends with exactly what the component prints when started with it."""
    name, value = setting
    rc, lines, _ = doctor(capsys, "--profile", "emulated", "emulator", environ={name: value})
    assert rc == 1
    (line,) = lines
    argv, env = component
    assert (
        line == f"glmserve.doctor: {name}={value!r} (environment): {_component_stderr(argv, env)}"
    )


def test_no_env_file_and_the_demos_services_is_clean(capsys):
    rc, lines, out = doctor(capsys, "--profile", "emulated", "emulator", "exporter", "prometheus")
    assert (rc, lines) == (0, [])
    assert out.startswith("glmserve.doctor: ok: no .env") and "docker (test double)" in out


def test_env_example_as_copied_names_what_the_gpu_stack_still_needs(capsys, tmp_path):
    """`cp .env.example .env` then `docker compose up`: the model dir and the Grafana password
    must be set, and the GPU profile needs the NVIDIA runtime. The emulated demo needs none."""
    copied = env_file(tmp_path, (REPO / ".env.example").read_text())
    rc, lines, _ = doctor(capsys, "--env-file", str(copied), host=no_gpu_host)
    assert rc == 1
    assert lines == [
        "glmserve.doctor: MODEL_DIR: glmserve.launch: error: model dir "
        "/models/GLM-5-NVFP4 does not exist (is the volume mounted?)",
        "glmserve.doctor: grafana: GRAFANA_ADMIN_PASSWORD is not set (cp .env.example .env and "
        "set it); there is no default admin password, so Grafana would not start",
        "glmserve.doctor: docker: no NVIDIA container runtime",
    ]
    rc, lines, _ = doctor(
        capsys,
        "--env-file",
        str(copied),
        environ={"MODEL_DIR": str(FAKE_GLM5), "GRAFANA_ADMIN_PASSWORD": "x"},
    )
    assert (rc, lines) == (0, [])
    rc, lines, _ = doctor(
        capsys, "--env-file", str(copied), "--profile", "emulated", "emulator", host=no_gpu_host
    )
    assert (rc, lines) == (0, [])  # no MODEL_DIR, no GPU runtime, no Grafana


def test_a_model_dir_of_the_wrong_model_gets_the_launchers_refusal(capsys, tmp_path):
    tiny = REPO / "deploy" / "models" / "tiny-mla"
    environ = {"MODEL_DIR": str(tiny), "GRAFANA_ADMIN_PASSWORD": "x", "COMPOSE_PROFILES": "gpu"}
    rc, lines, _ = doctor(capsys, environ=environ)
    assert rc == 1
    (line,) = lines
    assert line.startswith("glmserve.doctor: MODEL_DIR: glmserve.launch: error: model in ")
    assert "profile 'glm5-nvfp4-rtxpro6000-tp8' is for" in line


def test_the_smoke_service_inherits_sglangs_needs(capsys):
    """smoke `extends` sglang: the same model check and GPU reservation, said once for both."""
    environ = {"MODEL_DIR": str(REPO / "no-such-model"), "GRAFANA_ADMIN_PASSWORD": "x"}
    rc, lines, _ = doctor(
        capsys, "--profile", "smoke", "sglang", "smoke", environ=environ, host=no_gpu_host
    )
    assert rc == 1
    assert lines == [
        f"glmserve.doctor: MODEL_DIR: glmserve.launch: error: model dir {REPO}/no-such-model "
        "does not exist (is the volume mounted?)",
        "glmserve.doctor: docker: no NVIDIA container runtime",
    ]


def test_profile_and_service_names(capsys):
    rc, lines, _ = doctor(capsys, "--profile", "emulatd")
    assert rc == 1
    assert lines[0] == (
        "glmserve.doctor: --profile: compose profile 'emulatd' does not exist (did you mean "
        "emulated?); the compose files have: emulated, gpu, launcher, loadtest, smoke"
    )
    assert "no server would start" in lines[1]
    rc, lines, _ = doctor(capsys, "--profile", "emulated", "emulater")
    assert lines == [
        "glmserve.doctor: no service 'emulater' in the compose files (did you mean emulator?)"
    ]


EMULATED_ONLY = ("--profile", "emulated", "emulator")


def test_fleet_variables_are_checked_by_the_fleet(capsys):
    environ = {"FLEET_EMULATED": "1", "FLEET_EMULATED_REPLICAS": "0"}
    rc, lines, _ = doctor(capsys, "--profile", "emulated", "emulator", environ=environ)
    assert rc == 1
    assert lines == [
        "glmserve.doctor: FLEET_EMULATED_REPLICAS='0' (environment): glmserve.fleet: error: "
        "FLEET_EMULATED_REPLICAS must be >= 1"
    ]
    # Checked even where .env describes no fleet yet: a typo is found before it is rendered.
    rc, lines, _ = doctor(capsys, *EMULATED_ONLY, environ={"ROUTER_POLICY": "fastest"})
    assert rc == 1
    (line,) = lines
    assert line.startswith("glmserve.doctor: ROUTER_POLICY='fastest' (environment): ")
    assert "router policy 'fastest' is not one of" in line


def test_in_compose_checks_values_and_names_without_the_host(capsys, tmp_path):
    """The doctor service: no docker inside, no --profile to see; an unreadable .env is a note."""
    project = make_project(tmp_path / "project")
    (project / ".env").mkdir()  # unreadable as a file

    def no_host(needs_gpu: bool):
        raise AssertionError("the host must not be probed in compose")

    rc = main(["--in-compose", "--project-dir", str(project)], {"EMULATOR_TPOT_MS": "20"}, no_host)
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    assert "names not checked" in out and ".env checked" not in out
    (project / ".env").rmdir()
    (project / ".env").write_text("EMULATOR_TPOT_MSS=20\n")
    rc = main(["--in-compose", "--project-dir", str(project)], {"EMULATOR_TPOT_MS": "-1"}, no_host)
    _, err = capsys.readouterr()
    assert rc == 1
    assert err.splitlines() == [
        "glmserve.doctor: .env:1: EMULATOR_TPOT_MSS is not a known name (did you mean "
        "EMULATOR_TPOT_MS?); .env.example lists them all",
        "glmserve.doctor: EMULATOR_TPOT_MS='-1' (environment): python -m glmserve.emulator: "
        "error: --tpot-ms must be > 0 and finite (see --help)",
    ]


def runner(answers: dict[tuple[str, ...], Answer]):
    def run(argv: Sequence[str]) -> Answer:
        return answers.get(tuple(argv), Answer(1, "", f"unexpected {argv}"))

    return run


VERSION = ("docker", "version", "--format", "{{.Server.Version}}")
COMPOSE = ("docker", "compose", "version", "--short")
RUNTIMES = ("docker", "info", "--format", "{{json .Runtimes}}")


def test_host_checks_name_what_is_missing():
    def which(tool: str) -> str | None:
        return "/usr/bin/docker" if tool == "docker" else None

    healthy = {
        VERSION: Answer(0, "28.2.2\n", ""),
        COMPOSE: Answer(0, "2.29.1\n", ""),
        RUNTIMES: Answer(0, json.dumps({"runc": {}, "nvidia": {}}), ""),
    }
    assert check_host(True, runner(healthy), which) == (
        [],
        ["docker 28.2.2", "compose 2.29.1", "NVIDIA runtime"],
    )
    no_nvidia = {**healthy, RUNTIMES: Answer(0, json.dumps({"runc": {}}), "")}
    problems, _ = check_host(True, runner(no_nvidia), which)
    assert len(problems) == 1 and problems[0].startswith("docker: no NVIDIA container runtime")
    assert check_host(False, runner(no_nvidia), which)[0] == []
    # The toolkit's hook on PATH is what moby uses for a GPU request.
    assert check_host(True, runner(no_nvidia), lambda t: f"/usr/bin/{t}")[0] == []
    old = {**healthy, COMPOSE: Answer(0, "v2.20.3\n", "")}
    (line,) = check_host(False, runner(old), which)[0]
    assert line.startswith("docker compose v2.20.3 is older than 2.24")
    down = {VERSION: Answer(1, "", "Cannot connect to the Docker daemon at unix:///x.sock.\n")}
    lines = check_host(False, runner(down), which)[0]
    assert (
        lines[0]
        == "docker: the engine does not answer: Cannot connect to the Docker daemon at unix:///x.sock."
    )
    assert lines[1].startswith("docker compose: the compose plugin is missing")
    assert check_host(False, runner({}), lambda tool: None) == (
        ["docker: no docker command on PATH (install Docker Engine)"],
        [],
    )


def test_an_unknown_sglang_line_is_one_line_naming_the_lines_built(capsys):
    """SGLANG_LINE is a build argument that no service reads: the doctor checks it itself."""
    rc, lines, _ = doctor(
        capsys, "--profile", "emulated", "emulator", environ={"SGLANG_LINE": "0.5.18"}
    )
    assert rc == 1
    assert lines == [
        "glmserve.doctor: SGLANG_LINE='0.5.18' (environment): SGLang line '0.5.18' is not "
        "built here (lines: 0.5.12.post1, 0.5.17, 0.5.23)"
    ]
    rc, lines, _ = doctor(
        capsys, "--profile", "emulated", "emulator", environ={"SGLANG_LINE": "0.5.17"}
    )
    assert (rc, lines) == (0, [])
