"""The host: Docker, its compose plugin, and the NVIDIA runtime, asked through the docker CLI."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# compose.yaml uses !reset and !override (docs/deploy.md).
MIN_COMPOSE = (2, 24)
# moby starts a GPU request (`deploy.resources.reservations.devices`, driver nvidia) through this
# hook of the NVIDIA Container Toolkit; a configured toolkit also registers an `nvidia` runtime.
NVIDIA_HOOK = "nvidia-container-runtime-hook"


@dataclass(frozen=True)
class Answer:
    returncode: int
    stdout: str
    stderr: str


def run_command(argv: Sequence[str]) -> Answer:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Answer(127, "", str(exc))
    return Answer(proc.returncode, proc.stdout, proc.stderr)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def check_host(
    needs_gpu: bool,
    run: Callable[[Sequence[str]], Answer] = run_command,
    which: Callable[[str], str | None] = shutil.which,
) -> tuple[list[str], list[str]]:
    """(problems, notes): the notes are what was found, for the "ok" line."""
    if which("docker") is None:
        return ["docker: no docker command on PATH (install Docker Engine)"], []
    problems, notes = [], []
    server = run(["docker", "version", "--format", "{{.Server.Version}}"])
    if server.returncode != 0:
        problems.append(f"docker: the engine does not answer: {_last_line(server.stderr)}")
    else:
        notes.append(f"docker {server.stdout.strip()}")
    plugin = run(["docker", "compose", "version", "--short"])
    found = re.match(r"v?(\d+)\.(\d+)", plugin.stdout.strip()) if plugin.returncode == 0 else None
    if found is None:
        problems.append(
            "docker compose: the compose plugin is missing (Docker's docker-compose-plugin, "
            f"{MIN_COMPOSE[0]}.{MIN_COMPOSE[1]} or newer)"
        )
    elif (int(found[1]), int(found[2])) < MIN_COMPOSE:
        problems.append(
            f"docker compose {plugin.stdout.strip()} is older than {MIN_COMPOSE[0]}."
            f"{MIN_COMPOSE[1]}, which compose.yaml needs (!reset, !override)"
        )
    else:
        notes.append(f"compose {plugin.stdout.strip()}")
    if server.returncode == 0:
        runtimes = run(["docker", "info", "--format", "{{json .Runtimes}}"])
        try:
            names = set(json.loads(runtimes.stdout or "{}"))
        except ValueError:
            names = set()
        nvidia = "nvidia" in names or which(NVIDIA_HOOK) is not None
        if nvidia:
            notes.append("NVIDIA runtime")
        elif needs_gpu:
            problems.append(
                "docker: no NVIDIA container runtime (NVIDIA Container Toolkit): the gpu and "
                "smoke profiles need it; the emulated profile does not"
            )
        else:
            notes.append("no NVIDIA runtime (not needed here)")
    return problems, notes
