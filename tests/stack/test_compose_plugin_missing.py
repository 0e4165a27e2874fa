"""A docker CLI without its compose plugin: the compose tests skip with the reason (they once
failed with 4 errors, `unknown flag: --project-directory`), and under CI=true they fail.

Runs the fleet compose tests in a pytest of their own with a stand-in `docker` first on PATH,
one that knows no `compose` command, as Debian's docker.io does without docker-compose-v2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NO_COMPOSE_DOCKER = """#!/bin/sh
echo "docker: unknown command: docker $1" >&2
exit 1
"""


def run_compose_tests(tmp_path: Path, ci: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(NO_COMPOSE_DOCKER)
    docker.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CI": ci}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         str(REPO / "tests" / "fleet" / "test_fleet_compose.py"),
         "-k", "emulated_fleet or readme_default"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_docker_cli_without_compose_skips_locally_and_fails_in_ci(tmp_path, ci):
    proc = run_compose_tests(tmp_path, ci)
    out = proc.stdout + proc.stderr
    assert "unknown flag" not in out, out  # never reached docker compose itself
    if ci:
        assert proc.returncode == 1, out
        assert "CI=true but the docker compose v2 plugin is missing" in out
    else:
        assert proc.returncode == 0, out
        assert "2 skipped" in out and "error" not in out, out
        assert "the docker compose v2 plugin is missing" in out
