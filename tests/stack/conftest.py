"""Stack fixtures: local base images, the real Dockerfile's images, and one emulated compose stack.

Everything goes through the files a user runs (Dockerfile, compose.yaml), overriding only what CI
must change: base images (no registry), ports (tests run concurrently, so every port is picked
free), Prometheus's scrape interval (seconds, not minutes, of waiting) and Prometheus itself
(Debian's 2.42 in a local image instead of the pinned prom/prometheus).

Other files in tests/stack/ reuse the session-scoped `emulated_stack` (brought up once) and
`server_image`; helpers are in tests/support/stack.py. See docs/deploy.md.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from support.net import free_port
from support.stack import (
    CONTRACT_PORTS,
    EMULATOR_TPOT_MS,
    EMULATOR_TTFT_MS,
    HOST_CA_BUNDLE,
    REPO,
    TEST_SERVER_IMAGE,
    TEST_TOOLS_IMAGE,
    TIMINGS,
    Stack,
    Timings,
    compose_env,
    lock_build_args,
    render_prometheus_dir,
    run,
)

from glmserve.sglang_lines import CURRENT_LINE, DEFAULT_LINE


@pytest.fixture(scope="session")
def require_fn(request: pytest.FixtureRequest) -> Callable[[bool, str], None]:
    """The shared skip-locally/fail-in-CI policy from tests/conftest.py."""
    shared = request.config.pluginmanager.get_plugin(str(REPO / "tests" / "conftest.py"))
    assert shared is not None, "tests/conftest.py is not loaded"
    return shared.require  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def stack_timings() -> Timings:
    return TIMINGS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print where the stack tests' time went (the CI budget is for all of `make test`)."""
    if TIMINGS.phases:
        total = sum(TIMINGS.phases.values())
        parts = ", ".join(f"{k} {v:.1f}s" for k, v in TIMINGS.phases.items())
        terminalreporter.write_line(f"stack phases: {parts}; total {total:.1f}s")


@pytest.fixture(scope="session")
def ci_bases(docker_engine: None, stack_timings: Timings) -> dict[str, str]:
    """Local stand-ins for the registry bases (docker/ci-bases.sh), as KEY -> image tag."""
    with stack_timings.measure("ci bases"):
        # This interpreter's pip downloads the SGLang wheel (the venv CI just built has one).
        env = {**os.environ, "PYTHON": sys.executable}
        proc = run([str(REPO / "docker" / "ci-bases.sh")], env=env, timeout=900)
    bases = dict(line.split("=", 1) for line in proc.stdout.split() if "=" in line)
    for key in ("TOOLS_BASE_IMAGE", "BASE_IMAGE", "PROMETHEUS_IMAGE"):
        assert bases.get(key), f"docker/ci-bases.sh printed no {key}"
    return bases


@pytest.fixture(scope="session")
def build_ca() -> None:
    """Trust the host's CA bundle inside builds (TLS-intercepting proxy here; harmless elsewhere).

    Uses the Dockerfile's generic hook: certificates in the git-ignored .ca/ folder.
    """
    if not HOST_CA_BUNDLE.is_file():
        return
    target = REPO / ".ca" / "host-ca-bundle.crt"
    target.parent.mkdir(exist_ok=True)
    if not target.exists() or target.read_bytes() != HOST_CA_BUNDLE.read_bytes():
        # Atomic: a concurrent test session may be sending .ca/ to a build right now.
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        shutil.copyfile(HOST_CA_BUNDLE, partial)
        os.replace(partial, target)


@pytest.fixture(scope="session")
def tools_image(ci_bases: dict[str, str], build_ca: None, stack_timings: Timings) -> str:
    """The Dockerfile's `tools` stage, built through compose (as `docker compose build` does;
    the doctor service is the one that builds it)."""
    with stack_timings.measure("tools image build"):
        run(
            ["docker", "compose", "-f", "compose.yaml", "build", "doctor"],
            env=compose_env(ci_bases, COMPOSE_PROFILES="emulated"),
            timeout=900,
        )
    return TEST_TOOLS_IMAGE


@pytest.fixture(scope="session")
def server_image(ci_bases: dict[str, str], tools_image: str, stack_timings: Timings) -> str:
    """The Dockerfile's `server` stage on the local SGLang base: the patch stage runs for real."""
    args = lock_build_args()
    with stack_timings.measure("server image build"):
        run(
            ["docker", "compose", "-f", "compose.yaml", "build", "sglang"],
            env=compose_env(ci_bases, COMPOSE_PROFILES="gpu", **args),
            timeout=900,
        )
    return TEST_SERVER_IMAGE


@pytest.fixture(scope="session")
def current_line_image(ci_bases: dict[str, str], tools_image: str, stack_timings: Timings) -> str:
    """The same `server` stage built on the current SGLang line (glmserve.sglang_lines: 0.5.17),
    from the one build argument SGLANG_LINE, on that line's stand-in base."""
    line = CURRENT_LINE
    with stack_timings.measure(f"ci base sglang {line}"):
        env = {**os.environ, "PYTHON": sys.executable, "GLMSERVE_CI_SGLANG_LINE": line}
        proc = run([str(REPO / "docker" / "ci-bases.sh"), "sglang"], env=env, timeout=900)
    bases = dict(item.split("=", 1) for item in proc.stdout.split() if "=" in item)
    assert bases.get("BASE_IMAGE") == f"glmserve-ci/sglang:{line}", proc.stdout
    image = f"{TEST_SERVER_IMAGE}-sglang{line}"
    with stack_timings.measure(f"server image build ({line})"):
        run(
            ["docker", "compose", "-f", "compose.yaml", "build", "sglang"],
            env=compose_env(
                {**ci_bases, "BASE_IMAGE": bases["BASE_IMAGE"]},
                COMPOSE_PROFILES="gpu",
                GLMSERVE_IMAGE=image,
                **lock_build_args(line),
            ),
            timeout=900,
        )
    return image


@pytest.fixture(scope="session", params=["default", "current"])
def line_image(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(SGLang line, server image): the image built on each line CI covers."""
    if request.param == "default":
        return DEFAULT_LINE, request.getfixturevalue("server_image")
    return CURRENT_LINE, request.getfixturevalue("current_line_image")


@pytest.fixture(scope="session")
def emulated_stack(
    ci_bases: dict[str, str], tools_image: str, stack_timings: Timings
) -> Iterator[Stack]:
    """`make demo` (docker/demo.sh: the doctor, stand-in bases, `docker compose --profile
    emulated up --wait`), brought up once per session and torn down with its volumes at the end.

    Exactly the README's command; the test changes only what compose reads from the
    environment: free ports, a project name, the test's tools image, and an override file
    (COMPOSE_FILE) for Prometheus's 1 s scrape. The base images are NOT given: the demo finds
    the registry unreachable and builds its stand-ins itself (the same images as `ci_bases`)."""
    ports = {name: free_port() for name in CONTRACT_PORTS}
    workdir = Path(tempfile.mkdtemp(prefix="glmserve-stack-"))
    workdir.chmod(0o755)
    prom_dir = render_prometheus_dir(workdir / "prometheus")
    override = workdir / "compose.stack-test.yaml"
    # Same target path as compose.yaml's mount, so compose replaces it instead of adding one.
    override.write_text(
        yaml.safe_dump(
            {
                "services": {
                    "prometheus": {
                        "volumes": [f"{prom_dir}:/etc/prometheus:ro", "prometheus-data:/prometheus"]
                    },
                    # Docker runs the first health probe one interval after start; `up --wait`
                    # then returns seconds sooner.
                    "emulator": {"healthcheck": {"interval": "1s"}},
                    "exporter": {"healthcheck": {"interval": "1s"}},
                }
            }
        )
    )
    project = f"glmserve-stack-{os.getpid()}"
    files = [REPO / "compose.yaml", override]
    env = compose_env(
        ci_bases,
        SGLANG_PORT=str(ports["sglang"]),
        EXPORTER_LISTEN=f"127.0.0.1:{ports['exporter']}",
        PROMETHEUS_LISTEN=f"127.0.0.1:{ports['prometheus']}",
        EMULATOR_TPOT_MS=str(EMULATOR_TPOT_MS),
        EMULATOR_TTFT_MS=str(EMULATOR_TTFT_MS),
        # Exact timing for the accuracy assertions: the demo's default cost model adds per-layer
        # time on top of --tpot-ms.
        EMULATOR_COST_MODEL="off",
        EXPORTER_CANARY_INTERVAL="2s",
        COMPOSE_PROJECT_NAME=project,
        COMPOSE_FILE=os.pathsep.join(str(f) for f in files),
        PYTHON=sys.executable,
    )
    for found_by_the_demo in ("COMPOSE_PROFILES", "TOOLS_BASE_IMAGE", "PROMETHEUS_IMAGE"):
        env.pop(found_by_the_demo, None)
    services = ["emulator", "prometheus", "exporter"]
    stack = Stack(
        project=project,
        workdir=workdir,
        env=env,
        ports=ports,
        services=services,
        files=files,
    )
    try:
        with stack_timings.measure("make demo"):
            stack.log = run(["make", "--no-print-directory", "demo"], env=env, timeout=600).stdout
        yield stack
    finally:
        with stack_timings.measure("compose down"):
            logs = stack.compose("--profile", "emulated", "logs", "--no-color", check=False)
            (workdir / "compose.log").write_text(logs.stdout + logs.stderr)
            stack.compose(
                "--profile", "emulated", "down", "-v", "--remove-orphans", "-t", "10", check=False
            )
        shutil.rmtree(workdir, ignore_errors=True)
