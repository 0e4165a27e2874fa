"""Fixtures for the suite's end-to-end tests: a misbehaving SSE server (see sse_server.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from locustkit import SSE_SERVER


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
