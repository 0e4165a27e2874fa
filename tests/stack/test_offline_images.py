"""docker/offline-images.sh: every image of the stack saved on one host and loaded on another
that has no registry, checked by image ID, with the .env lines compose then needs.

The real images need a registry to pull and PyPI to build, neither of which CI has: stand-ins
(one local base under three tags) play Prometheus, Grafana and the tools image; the script's
own logic (names from compose's variables, tags without digests, the ID check) is the same.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest
from support.stack import REPO, no_user_env_file, run

SCRIPT = REPO / "docker" / "offline-images.sh"
STAND_INS = {
    "PROMETHEUS_IMAGE": "glmserve-test/prometheus:offline",
    "GRAFANA_IMAGE": "glmserve-test/grafana:offline",
    "GLMSERVE_TOOLS_IMAGE": "glmserve-test/tools:offline",
}


@pytest.fixture(scope="module")
def stand_ins(ci_bases: dict[str, str]) -> Iterator[dict[str, str]]:
    # docker/ci-bases.sh imports this base (and builds the others on it).
    base = os.environ.get("GLMSERVE_CI_DEBIAN_IMAGE", "local/debian:bookworm")
    for tag in STAND_INS.values():
        run(["docker", "tag", base, tag])
    yield dict(STAND_INS)
    subprocess.run(["docker", "rmi", *STAND_INS.values()], capture_output=True, check=False)


def offline(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # compose reads the test's env file, never the checkout's .env.
    env = {"COMPOSE_ENV_FILES": str(no_user_env_file()), **env}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
        cwd=REPO,
    )


def test_the_images_are_the_ones_compose_would_run(compose_cli, tmp_path):
    """Names come from `docker compose config`, so an .env value counts and so does the server
    image's nested default (`...-sglang${SGLANG_LINE:-...}`), which a sed once cut at its first
    `}`. Needs the compose CLI only, no engine."""
    user = tmp_path / "user.env"
    user.write_text("SGLANG_LINE=0.5.17\nGRAFANA_IMAGE=grafana/grafana:12.0.0\n")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_IMAGE")}
    env.update(COMPOSE_ENV_FILES=str(user), DOCKER_HOST="unix:///nonexistent-glmserve.sock")
    proc = subprocess.run(["bash", str(SCRIPT), "refs", "--with-server"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    refs = dict(line.split("=", 1) for line in proc.stdout.splitlines())
    assert refs["GLMSERVE_IMAGE"] == "glmserve/server:0.1.0-sglang0.5.17"
    assert refs["GRAFANA_IMAGE"] == "grafana/grafana:12.0.0"
    assert refs["GLMSERVE_TOOLS_IMAGE"] == "glmserve/tools:0.1.0"
    assert refs["PROMETHEUS_IMAGE"].startswith("prom/prometheus:v3.5.0@sha256:")


def test_save_then_load_verifies_every_image_and_prints_the_env_lines(stand_ins, tmp_path):
    bundle = tmp_path / "bundle"
    saved = offline("save", str(bundle), OFFLINE_NO_BUILD="1", **stand_ins)
    assert saved.returncode == 0, saved.stderr[-2000:]
    assert (bundle / "images.tar").stat().st_size > 1_000_000
    loaded = offline("load", str(bundle))
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    lines = [ln for ln in loaded.stdout.splitlines() if not ln.startswith("#")]
    assert lines == [f"{k}={v}" for k, v in stand_ins.items()] + ["GLMSERVE_PULL_POLICY=never"]
    assert "all 3 images verified" in loaded.stderr


def test_a_mixed_up_bundle_is_refused_in_one_line(stand_ins, tmp_path):
    bundle = tmp_path / "bundle"
    assert offline("save", str(bundle), OFFLINE_NO_BUILD="1", **stand_ins).returncode == 0
    ids = (bundle / "images.ids").read_text().splitlines()
    tag = ids[0].split()[0]
    (bundle / "images.ids").write_text("\n".join([f"{tag} sha256:{'0' * 64}", *ids[1:]]) + "\n")
    proc = offline("load", str(bundle))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"offline-images.sh: error: {tag} loaded as {ids[0].split()[1]}, but the bundle "
        f"recorded sha256:{'0' * 64} (a changed or mixed-up bundle)"
    )


def test_an_image_that_cannot_be_pulled_here_is_one_line(stand_ins, tmp_path):
    env = {**stand_ins, "GRAFANA_IMAGE": "glmserve-test/nowhere:1@sha256:" + "1" * 64}
    proc = offline("save", str(tmp_path / "b"), OFFLINE_NO_BUILD="1", **env)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("offline-images.sh: error: cannot pull glmserve-test/nowhere:1@sha256:")
    )


def test_bad_usage_is_one_line(tmp_path):
    for args in ([], ["save"], ["save", "d", "--server"], ["load", str(tmp_path)]):
        proc = offline(*args)
        assert proc.returncode == 2, args
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("offline-images.sh: error:")
