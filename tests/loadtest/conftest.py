"""Fixtures for the suite's end-to-end tests: the fault-injecting SSE server (support/sse.py) as
a process of its own, as a target apart from pytest."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.locust_run import SSE_SERVER


@pytest.fixture
def sse_server(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start tests/support/sse.py with the given modes (default: all in turn); yields its URL."""
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
