"""`make venv` says what it installs and how long it took; `make venv-tools` installs only what
runs on the host (Locust, the doctor, the preview, the emulator, the exporter, the fleet
command): none of the test suite's heavy dependencies."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "smg", "kubernetes-validate", "numpy", "hypothesis")


def dry_make(target: str, tmp_path: Path) -> str:
    if shutil.which("make") is None:
        pytest.skip("no make on PATH")
    proc = subprocess.run(
        ["make", "-n", "--no-print-directory", target, f"VENV={tmp_path / 'venv'}"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def extras_of(command: str) -> list[str]:
    (spec,) = [word for word in command.split() if word.startswith("'.[")]
    return spec.strip("'.[]").split(",")


def test_venv_tools_installs_the_host_tools_and_nothing_heavy(tmp_path):
    out = dry_make("venv-tools", tmp_path)
    extras = extras_of(out)
    assert set(extras) == {"emulator", "exporter", "loadtest", "doctor", "fleet"}
    text = (REPO / "pyproject.toml").read_text()
    wanted = set()
    for extra in extras:  # `name = ["a", "b"]` lines of [project.optional-dependencies]
        (deps,) = re.findall(rf"^{extra} = \[([^\]]*)\]", text, re.M)
        wanted |= set(re.findall(r'"([A-Za-z0-9_.-]+)', deps))
    assert not wanted & set(HEAVY), wanted & set(HEAVY)
    assert {"locust", "matplotlib", "pyyaml", "python-dotenv"} <= wanted
    assert "about 300 MB" in out and "done in" in out


def test_venv_says_what_and_how_long(tmp_path):
    out = dry_make("venv", tmp_path)
    assert {"kernels", "router", "dev", "loadtest", "doctor"} <= set(extras_of(out))
    (said,) = [line for line in out.splitlines() if line.startswith('echo "venv: the tools')]
    assert "about 2 GB" in said and "make venv-tools" in said
    assert "venv: done in" in out
