"""Helpers for the suite's end-to-end tests: a misbehaving SSE server and a headless Locust run.

Locust runs in a subprocess: importing it here would gevent-patch the whole pytest process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "loadtest" / "decode.py"
SSE_SERVER = Path(__file__).with_name("sse_server.py")


@dataclass
class LocustRun:
    returncode: int
    output: str
    report: Path

    @property
    def summary(self) -> dict:
        return json.loads((self.report / "summary.json").read_text())


def run_locust(host: str, report: Path, *args: str, timeout_s: float = 90) -> LocustRun:
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-H", host,
            "--report-dir", str(report), "--only-summary", *args]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    return LocustRun(proc.returncode, proc.stdout + proc.stderr, report)


@pytest.fixture
def sse_server(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start tests/loadtest/sse_server.py with the given behaviours; yields its base URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*modes: str) -> str:
        port_file = tmp_path / f"port-{len(procs)}"
        proc = subprocess.Popen([sys.executable, str(SSE_SERVER), str(port_file), *modes])
        procs.append(proc)
        deadline = time.monotonic() + 20
        while not (port_file.exists() and port_file.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the SSE test server did not start")
            time.sleep(0.05)
        return f"http://127.0.0.1:{port_file.read_text()}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)
