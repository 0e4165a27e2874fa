"""Helpers for the stack tests (their fixtures live in tests/stack/conftest.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Image names the tests build; never the names a user's compose would use.
TEST_SERVER_IMAGE = "glmserve-test/server:ci"
TEST_TOOLS_IMAGE = "glmserve-test/tools:ci"
EMULATOR_TPOT_MS = 20
EMULATOR_TTFT_MS = 100
# The services' default ports (.env.example), each replaced by a free one in tests.
CONTRACT_PORTS = {"sglang": 30000, "exporter": 9464, "prometheus": 9090}


def run(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    check: bool = True,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure, fail with its output tail (build logs are long)."""
    proc = subprocess.run(
        list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        pytest.fail(f"{' '.join(argv)} exited {proc.returncode}:\n{tail}", pytrace=False)
    return proc


class Timings:
    """Wall time of each stack phase, printed at the end of the session (the CI budget)."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}

    def measure(self, name: str) -> _Timer:
        return _Timer(self, name)


@dataclass
class _Timer:
    timings: Timings
    name: str
    start: float = 0.0

    def __enter__(self) -> None:
        self.start = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.timings.phases[self.name] = time.monotonic() - self.start


def lock_build_args(line: str | None = None) -> dict[str, str]:
    """SGLANG_LINE / PATCH_LOCK_SHA256 as the patch tool would record them for that line (the
    Dockerfile's default line unless given): each line is its own source series."""

    raw = (REPO / "patches" / "series.lock.json").read_bytes()
    lock = json.loads(raw)
    version = line or dockerfile_arg("SGLANG_LINE")
    assert version in lock["series"], f"series.lock.json has no series for SGLang {version}"
    source = lock["series"][version]["source"]  # the marker names the source series applied
    assert source == version, f"SGLang line {version} is served by series {source}, not its own"
    return {"SGLANG_LINE": version, "PATCH_LOCK_SHA256": hashlib.sha256(raw).hexdigest()}


def dockerfile_arg(name: str) -> str:
    """The default of `ARG name=...` in the top-level Dockerfile (first occurrence)."""
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.startswith(f"ARG {name}="):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError(f"Dockerfile has no 'ARG {name}=' line")


def no_user_env_file() -> Path:
    """An empty env file the tests own: compose (and the doctor, and `make demo`) read it
    instead of the checkout's .env, so a developer's own settings never change what is tested."""
    path = REPO / ".cache" / "stack" / "tests.env"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text():
        path.write_text("")
    return path


def compose_env(bases: dict[str, str], **extra: str) -> dict[str, str]:
    """The process environment for `docker compose`, with CI's images and build args."""
    env = dict(os.environ)
    env.update(
        COMPOSE_ENV_FILES=str(no_user_env_file()),
        GLMSERVE_IMAGE=TEST_SERVER_IMAGE,
        GLMSERVE_TOOLS_IMAGE=TEST_TOOLS_IMAGE,
        TOOLS_BASE_IMAGE=bases["TOOLS_BASE_IMAGE"],
        BASE_IMAGE=bases["BASE_IMAGE"],
        PROMETHEUS_IMAGE=bases["PROMETHEUS_IMAGE"],
        # The CI base has no torch: keep the preflight's static checks, skip the module import.
        PREFLIGHT_ARGS="--no-import",
        # compose.yaml refuses to interpolate without it; Grafana itself is not started in CI.
        GRAFANA_ADMIN_PASSWORD="stack-test-not-a-secret",
    )
    env.update(extra)
    return env


def render_prometheus_dir(dest: Path, interval: str = "1s") -> Path:
    """Copy monitoring/prometheus/ with a short scrape interval. The targets are not touched:
    compose.yaml's prometheus service writes them at start from the ports the test gives the
    services (SGLANG_PORT, EXPORTER_LISTEN, PROMETHEUS_LISTEN), as it does for a user."""
    src = REPO / "monitoring" / "prometheus"
    shutil.copytree(src, dest)
    config = yaml.safe_load((src / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = interval
    config["global"]["evaluation_interval"] = interval
    config["global"]["scrape_timeout"] = interval
    for job in config.get("scrape_configs", []):
        job["scrape_interval"] = interval
        job.pop("scrape_timeout", None)
        for sd in job.get("file_sd_configs", []):
            sd["refresh_interval"] = interval
    (dest / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    # Prometheus runs as nobody; a pytest tmp dir (0700) would be unreadable to it.
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


@dataclass
class Stack:
    """One running compose project (emulated profile), all on 127.0.0.1 with free ports."""

    project: str
    workdir: Path
    env: dict[str, str]
    ports: dict[str, int]
    services: list[str]
    files: list[Path] = field(default_factory=list)
    log: str = ""  # what the command that started it printed (`make demo`)

    @property
    def sglang_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['sglang']}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}"

    def compose(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        argv = ["docker", "compose", "-p", self.project, "--project-directory", str(REPO)]
        for f in self.files:
            argv += ["-f", str(f)]
        return run([*argv, *args], env=self.env, check=check, timeout=timeout)

    def prom_query(self, expr: str) -> list[dict[str, Any]]:
        """Instant PromQL query; the result vector (empty when nothing matches yet)."""
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def wait_for_series(self, expr: str, timeout_s: float = 60) -> list[dict[str, Any]]:
        """Poll until `expr` returns at least one series; fail with the last answer otherwise."""
        deadline = time.monotonic() + timeout_s
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.prom_query(expr)
            if result:
                return result
            time.sleep(1)
        pytest.fail(f"PromQL {expr!r} returned no series within {timeout_s:.0f}s", pytrace=False)


def image_files(image: str, pattern: str) -> list[str]:
    """Paths in `image` whose name matches `pattern` (find -name)."""
    proc = run(
        [
            "docker",
            "run",
            "--rm",
            "--entrypoint",
            "sh",
            image,
            "-c",
            f"find / -xdev -name '{pattern}' 2>/dev/null || true",
        ],
        timeout=120,
    )
    return [line for line in proc.stdout.splitlines() if line.strip()]


# One per session: filled by the fixtures, printed by conftest's terminal-summary hook.
TIMINGS = Timings()
