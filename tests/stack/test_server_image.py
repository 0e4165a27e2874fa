"""The real Dockerfile's `server` stage, built on a local base holding an SGLang line's wheel (no
GPU deps): the patch series is applied to real SGLang source during the build, then the image's
own preflight and the launcher's --dry-run run inside it for every profile of that line. CI builds
it on the default line (0.5.12.post1) and on the current one (0.5.17), from SGLANG_LINE alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.launch import model_fixture
from support.stack import REPO, compose_env, image_files, lock_build_args, run

from glmserve.launch import load_profile
from glmserve.launch.profiles import sglang_versions

pytestmark = pytest.mark.stack

PROFILES = sorted(p.stem for p in (REPO / "deploy" / "profiles").glob("*.json"))
FAKE_GLM5 = REPO / "tests" / "fixtures" / "glm5-nvfp4"


def docker_run(
    image: str, *args: str, entrypoint: str | None = None, mounts: dict[Path, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = ["docker", "run", "--rm", "--network", "none"]
    for host, target in (mounts or {}).items():
        argv += ["-v", f"{host}:{target}:ro"]
    if entrypoint:
        argv += ["--entrypoint", entrypoint]
    return run([*argv, image, *args], check=False, timeout=120)


def sglang_site(image: str) -> str:
    proc = run(
        ["docker", "run", "--rm", "--entrypoint", "cat", image, "/opt/glmserve-build/sglang-site"]
    )
    return proc.stdout.strip()


def profile_data(name: str) -> dict[str, Any]:
    return json.loads((REPO / "deploy" / "profiles" / f"{name}.json").read_text())


def test_labels_name_sglang_and_the_applied_series(line_image: tuple[str, str]) -> None:
    line, image = line_image
    labels = json.loads(
        run(["docker", "inspect", "--format", "{{json .Config.Labels}}", image]).stdout
    )
    want = lock_build_args(line)
    assert labels["io.glmserve.sglang.version"] == line
    assert labels["io.glmserve.patch.series"] == want["SGLANG_LINE"] == line
    assert labels["io.glmserve.patch.lock-sha256"] == want["PATCH_LOCK_SHA256"]


def test_entrypoint_is_the_launcher_without_a_shell(server_image: str) -> None:
    entry = json.loads(
        run(["docker", "inspect", "--format", "{{json .Config.Entrypoint}}", server_image]).stdout
    )
    assert entry == ["python3", "-m", "glmserve.launch"]


def test_marker_records_the_lock_the_build_applied(line_image: tuple[str, str]) -> None:
    line, image = line_image
    site = sglang_site(image)
    proc = docker_run(image, f"{site}/sglang/.glmserve-patch.json", entrypoint="cat")
    assert proc.returncode == 0, proc.stderr
    marker = json.loads(proc.stdout)
    assert marker["sglang_version"] == marker["series"] == line
    assert marker["lock_sha256"] == lock_build_args(line)["PATCH_LOCK_SHA256"]
    assert "sglang/srt/layers/attention/fp8_kv_gather.py" in marker["files"]
    fa3 = "sglang/srt/layers/attention/flashattention_backend.py"
    assert (fa3 in marker["files"]) is (line != "0.5.12.post1")  # the fa3 MLA path from 0.5.17


def test_preflight_passes_in_the_image(line_image: tuple[str, str]) -> None:
    """The same check the build ran, re-run in the final image (static part: no torch here):
    on 0.5.17 that includes the FlashAttention rules on the patched fa3 file."""
    line, image = line_image
    site = sglang_site(image)
    proc = docker_run(
        image,
        "-m",
        "glmserve.preflight",
        "--target",
        site,
        "--no-import",
        "--expect-line",
        line,
        entrypoint="python3",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ok: SGLang {line} patched with series {line}" in proc.stdout


def test_a_base_of_another_line_fails_the_check_in_one_line(line_image: tuple[str, str]) -> None:
    """What the build runs against the base: the installed SGLang must be the line's."""
    line, image = line_image
    other = "0.5.17" if line == "0.5.12.post1" else "0.5.12.post1"
    site = sglang_site(image)
    argv = ["-m", "glmserve.preflight", "--target", site, "--no-import", "--expect-line"]
    proc = docker_run(image, *argv, other, entrypoint="python3")
    assert proc.returncode == 1
    assert [ln for ln in proc.stderr.splitlines() if "the base holds SGLang" in ln] == [
        f"python -m glmserve.preflight: FAIL: the base holds SGLang {line}, the line is "
        f"{other}: build SGLANG_LINE={other} on lmsysorg/sglang:v{other}-cu130"
        + (
            "@sha256:ceaf8b16e02d165143633ac228bbb994a05fe77d7e0526cf035ae4bbf4eacc36"
            if other == "0.5.12.post1"
            else ""
        )
    ]


@pytest.mark.parametrize("profile", PROFILES)
def test_launcher_dry_run_in_the_image(line_image: tuple[str, str], profile: str) -> None:
    """Each shipped profile validates inside the image of its line and yields an argv for
    sglang.launch_server (the launcher reads that line's own parser there); in the other line's
    image it is refused in one line.

    GLM-5.x profiles get the fake model dir their model checks take (GLM-5-NVFP4, or GLM-5.2-NVFP4
    for the glm52-* ones: config fields, no weights) at /model; the tiny MLA profiles use the
    model shipped in the image. GPUs are not probed by --dry-run.
    """
    line, server_image = line_image
    data = profile_data(profile)
    args = ["--profile", profile, "--dry-run"]
    mounts: dict[Path, str] = {}
    if data["model"].get("default_path") is None:
        mounts[model_fixture(profile)] = "/model"
        args += ["--model-path", "/model"]
    if data.get("nodes", 1) > 1:  # a multi-node profile refuses to plan without its rank
        args += ["--node-rank", "0", "--dist-init-addr", "10.0.0.1:5000"]
    proc = docker_run(server_image, *args, mounts=mounts)
    if line not in sglang_versions(load_profile(REPO / "deploy" / "profiles", profile)):
        assert proc.returncode == 2
        assert f"installed SGLang is {line}" in proc.stderr.strip(), proc.stderr
        return
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    argv = report["argv"]
    assert argv[1:3] == ["-m", "sglang.launch_server"], argv
    for flag in data["args"]:
        assert flag in argv, (flag, argv)
    assert report["sglang"]["version"] == line
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_launcher_refuses_an_unknown_profile_in_one_line(server_image: str) -> None:
    proc = docker_run(server_image, "--profile", "no-such-profile", "--dry-run")
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert PROFILES[0] in lines[0]


def test_the_smoke_test_ships_in_the_server_image(server_image: str) -> None:
    """`docker compose run --rm smoke` runs python3 -m glmserve.smoke in this image; its bad
    input is one line (here: no profile, nothing started)."""
    proc = docker_run(server_image, "-m", "glmserve.smoke", "--help", entrypoint="python3")
    assert proc.returncode == 0, proc.stderr
    assert "--variants" in proc.stdout
    proc = docker_run(server_image, "-m", "glmserve.smoke", entrypoint="python3")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "glmserve.smoke: error: no profile given (--profile or GLMSERVE_PROFILE)"
    ]


def test_build_time_ca_is_not_in_the_server_image(server_image: str) -> None:
    assert image_files(server_image, "os-release")  # control: the search itself works
    assert image_files(server_image, "host-ca-bundle.crt") == []
    assert image_files(server_image, "build-ca*") == []


def test_compose_sglang_service_dry_run(
    ci_bases: dict[str, str], server_image: str, tmp_path: Path
) -> None:
    """The compose service as written (environment, model mount, volumes, entrypoint), minus its
    GPU reservation and ulimits: a JSON extra arg set the way .env.example shows reaches SGLang's argv as one
    intact element, and the empty defaults compose passes mean "unset" to the launcher."""
    no_gpu = tmp_path / "no-gpu.yaml"
    # This CI sandbox may not raise RLIMIT_MEMLOCK, so the ulimits go too (a GPU host allows
    # them); the image is the one `server_image` built, so `run` must not rebuild (its classic
    # builder log would land on stdout, where the JSON report is read).
    no_gpu.write_text(
        "services:\n  sglang:\n    deploy: !reset {}\n    ulimits: !reset {}\n"
        "    pull_policy: never\n"
    )
    override = json.dumps({"rope_scaling": {"type": "yarn", "factor": 2.0}})
    extra = ["--json-model-override-args", override]
    env = compose_env(
        ci_bases,
        MODEL_DIR=str(FAKE_GLM5),
        GLMSERVE_EXTRA_ARGS=json.dumps(extra),
        **lock_build_args(),
    )
    env.pop("COMPOSE_PROFILES", None)
    base = ["docker", "compose", "-p", f"glmserve-dry-{os.getpid()}"]
    base += ["-f", str(REPO / "compose.yaml"), "-f", str(no_gpu), "--profile", "gpu"]
    try:
        proc = run([*base, "run", "--rm", "--no-deps", "-T", "sglang", "--dry-run"], env=env)
    finally:
        subprocess.run([*base, "down", "-v"], env=env, capture_output=True, timeout=120)
    report = json.loads(proc.stdout)
    assert report["profile"] == "glm5-nvfp4-rtxpro6000-tp8"
    assert report["model_path"] == "/model"
    assert report["model_path_on_host"] == str(FAKE_GLM5)
    argv = report["argv"]
    at = argv.index("--json-model-override-args")
    assert argv[at + 1] == override
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "30000"


def test_a_line_without_a_series_fails_the_build_in_one_line(
    ci_bases: dict[str, str], tools_image: str
) -> None:
    """SGLANG_LINE set to a real release the series do not serve (0.5.22: the 0.5.23 series
    stops applying there) fails the build at apply.py with its one line, as today."""
    line = "0.5.22"
    env = {**os.environ, "PYTHON": sys.executable, "GLMSERVE_CI_SGLANG_LINE": line}
    proc = run([str(REPO / "docker" / "ci-bases.sh"), "sglang"], env=env, timeout=900)
    base = dict(item.split("=", 1) for item in proc.stdout.split() if "=" in item)["BASE_IMAGE"]
    argv = [
        "docker",
        "build",
        "--network",
        "host",
        "--target",
        "server",
        "-t",
        "glmserve-test/refused:ci",
    ]
    for key, value in {
        "BASE_IMAGE": base,
        "SGLANG_LINE": line,
        "TOOLS_BASE_IMAGE": ci_bases["TOOLS_BASE_IMAGE"],
        "PREFLIGHT_ARGS": "--no-import",
    }.items():
        argv += ["--build-arg", f"{key}={value}"]
    proc = run([*argv, str(REPO)], check=False, timeout=900)
    assert proc.returncode != 0
    said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "glmserve-patch:" in ln]
    assert len(said) == 1, said
    assert f"SGLang {line} is not supported: no patch series for it" in said[0]
