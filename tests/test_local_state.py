"""The tests read no local state they did not set up: with a user's `.env` and `locust.conf` in
the checkout (the README's first step is `cp .env.example .env`, then edits), the tests that read
env files, compose.yaml, the launcher's inputs or Locust's settings still pass.

A copy of the checkout's tracked files gets a hostile `.env` (the example plus bad values and
moved ports), and those tests run there in a child pytest. Before this, `make test` after the
README's setup failed in tests/doctor: a test read the checkout's .env.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.policy import require

REPO = Path(__file__).resolve().parents[1]
# Everything that reads .env, COMPOSE_* or the project dir: the doctor, the env reader, the
# fleet's command, the launcher's value checks (the doctor calls them).
AFFECTED = [
    "tests/doctor",
    "tests/test_envfile.py",
    "tests/fleet/test_fleet_compose.py",
    "tests/launch/test_launch_values.py",
    # Locust reads locust.conf from its working directory and ~/.locust.conf.
    "tests/loadtest/test_loadtest_usability.py",
]
# A user's Locust settings: every run would then breach an SLO it never asked for.
HOSTILE_LOCUST_CONF = "slo-tpot-ms = 0.001\nusers = 3\n"
HOSTILE = """
# A user's edits after `cp .env.example .env`: every one of these would fail a test that read it.
EMULATOR_TPOT_MS=oops
SGLANG_PORT=1
EXPORTER_LISTEN=127.0.0.1:99999
GLMSERVE_EXTRA_ARGS='["--no-such-flag"]'
FLEET_EMULATED=1
FLEET_EMULATED_REPLICAS=0
COMPOSE_PROJECT_NAME=Not Valid
GRAFANA_ADMIN_PASSWORD=
"""


def tracked_copy(dest: Path) -> Path:
    proc = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        timeout=60,
    )
    require(proc.returncode == 0, f"git ls-files failed in {REPO}: {proc.stderr[-200:]!r}")
    for name in proc.stdout.decode().split("\0"):
        source = REPO / name
        if name and source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


@pytest.mark.slow
def test_the_tests_that_read_env_files_pass_with_a_users_env_in_the_checkout(tmp_path):
    checkout = tracked_copy(tmp_path / "checkout")
    (checkout / ".env").write_text((REPO / ".env.example").read_text() + HOSTILE)
    (checkout / "locust.conf").write_text(HOSTILE_LOCUST_CONF)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GLMSERVE_", "COMPOSE_", "EMULATOR_", "FLEET_", "SGLANG_"))
    }
    env["PYTHONPATH"] = str(checkout / "src")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *AFFECTED],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout
