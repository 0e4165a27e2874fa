"""The no-GPU demo as CI runs it: `docker compose --profile emulated up` with the tools image built
from the real Dockerfile, then real HTTP and a real Prometheus scrape, all on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest
from support.net import free_port
from support.stack import (
    EMULATOR_TTFT_MS,
    REPO,
    Stack,
    compose_env,
    image_files,
    run,
)

from glmserve.streaming import StreamRequest, time_stream

pytestmark = pytest.mark.stack


def test_health(emulated_stack: Stack) -> None:
    with urllib.request.urlopen(emulated_stack.sglang_url + "/health", timeout=10) as resp:
        assert resp.status == 200


def test_one_streamed_completion(emulated_stack: Stack) -> None:
    """One chat stream through the container: every token arrives, usage counts them, the
    first content waits at least the configured TTFT (a lower bound the emulator guarantees)."""
    timing = time_stream(
        emulated_stack.sglang_url, StreamRequest(route="chat", max_tokens=16), timeout_s=30
    )
    assert timing.output_tokens == 16
    assert timing.token_events >= 1
    assert timing.ttft_s >= EMULATOR_TTFT_MS / 1000 * 0.95


def test_prometheus_scraped_the_containerized_emulator(emulated_stack: Stack) -> None:
    """A real Prometheus (in a container, from compose) holds sglang:gen_throughput scraped from
    the emulator container at the stack's own port."""
    # Make sure something was served, so the gauge reflects traffic, not only its initial value.
    time_stream(emulated_stack.sglang_url, StreamRequest(max_tokens=8), timeout_s=30)
    target = f"127.0.0.1:{emulated_stack.ports['sglang']}"
    series = emulated_stack.wait_for_series(f'sglang:gen_throughput{{instance="{target}"}}')
    value = float(series[0]["value"][1])
    assert value >= 0.0
    up = emulated_stack.wait_for_series(f'up{{instance="{target}"}}')
    assert up[0]["value"][1] == "1"
    generated = emulated_stack.wait_for_series(
        f'sglang:generation_tokens_total{{instance="{target}"}} > 0'
    )
    assert float(generated[0]["value"][1]) >= 8


def test_build_time_ca_is_not_in_the_tools_image(tools_image: str) -> None:
    """The CA given to the build (.ca/) stays in the throw-away stage."""
    assert (REPO / ".ca").is_dir()  # the build did get one (the build_ca fixture)
    assert image_files(tools_image, "os-release")  # control: the search itself works
    assert image_files(tools_image, "host-ca-bundle.crt") == []
    assert image_files(tools_image, "build-ca*") == []


def test_docker_stop_is_clean(ci_bases: dict[str, str], tools_image: str) -> None:
    """`docker compose stop` ends the emulator by SIGTERM (init: true forwards it), not by the
    SIGKILL that follows the grace period: exit code 137 would mean the signal was ignored."""
    port = free_port()
    project = f"glmserve-stop-{port}"
    env = compose_env(ci_bases, SGLANG_PORT=str(port))
    env.pop("COMPOSE_PROFILES", None)
    base = ["docker", "compose", "-p", project, "-f", str(REPO / "compose.yaml")]
    base += ["--profile", "emulated"]
    try:
        run(
            [*base, "up", "-d", "--no-build", "--wait", "--wait-timeout", "60", "emulator"], env=env
        )
        run([*base, "stop", "-t", "20", "emulator"], env=env, timeout=60)
        ids = run([*base, "ps", "-a", "-q", "emulator"], env=env).stdout.split()
        assert ids, "no emulator container"
        state = json.loads(run(["docker", "inspect", "--format", "{{json .State}}", ids[0]]).stdout)
        assert state["ExitCode"] != 137 and not state["OOMKilled"], state
    finally:
        subprocess.run([*base, "down", "-v", "-t", "5"], env=env, capture_output=True, timeout=120)
