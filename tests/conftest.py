"""Suite-wide fixtures: the prerequisites (Docker, Prometheus), each skipped locally and a
failure under CI=true (support.policy), and the GPU-test skip."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from support.policy import IN_CI, require

# Patch and kernel tests: CI has everything they need, so a skip there hides a broken setup
# (a missing wheel, torch not installed, Triton imported too early) behind a green run.
NO_SKIP_IN_CI = tuple(
    Path(__file__).resolve().parent / room
    for room in ("series", "preflight", "selftest", "kernels")
)


@pytest.fixture(name="require", scope="session")
def require_fixture() -> Callable[[bool, str], None]:
    """support.policy.require for fixtures that take it as an argument."""
    return require


def docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=20)
    return probe.returncode == 0


def compose_plugin_problem() -> str | None:
    """Why `docker compose` cannot run here (no CLI, or a CLI without the compose v2 plugin,
    which then fails on the first compose flag), or None."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        return "the docker compose v2 plugin is missing (.ci/run installs it)"
    return None


@pytest.fixture(scope="session")
def compose_cli() -> None:
    """The docker CLI with its compose plugin: enough for the offline `docker compose config`."""
    problem = compose_plugin_problem()
    require(problem is None, problem or "")


@pytest.fixture(scope="session")
def docker_engine(compose_cli: None) -> None:
    """A running Docker engine with the compose plugin."""
    require(docker_available(), "no Docker engine is running (start dockerd, see .ci/run)")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """Path to a real Prometheus server binary."""
    path = shutil.which("prometheus")
    require(path is not None, "no prometheus binary on PATH (apt-get install prometheus)")
    return str(path)


@pytest.fixture(scope="session")
def promtool_binary() -> str:
    path = shutil.which("promtool")
    require(path is not None, "no promtool on PATH (apt-get install prometheus)")
    return str(path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # GPU tests never run in CI (no accelerator there); they run on the H200 via the device tool.
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200, see bench/README.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _forbidden_skip(path: Path | None) -> bool:
    if not IN_CI or path is None:
        return False
    path = Path(path).resolve()
    return any(path == d or d in path.parents for d in NO_SKIP_IN_CI)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _forbidden_skip(item.path):
        report.outcome = "failed"
        report.longrepr = f"CI=true forbids skipping patch/kernel tests: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    outcome = yield
    report = outcome.get_result()
    # A module-level importorskip/skip ends up here, before any test item exists.
    if report.skipped and _forbidden_skip(getattr(collector, "path", None)):
        report.outcome = "failed"
        report.longrepr = f"CI=true forbids skipping patch/kernel tests: {report.longrepr}"
