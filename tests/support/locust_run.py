"""Headless runs of loadtest/decode.py for the Locust suite's end-to-end tests.

Locust runs in a subprocess: importing it here would gevent-patch the whole pytest process.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "loadtest" / "decode.py"
SSE_SERVER = Path(__file__).with_name("sse.py")  # run as a process: see its docstring


@dataclass
class LocustRun:
    returncode: int
    output: str
    report: Path

    @property
    def summary(self) -> dict:
        return json.loads((self.report / "summary.json").read_text())


@functools.lru_cache(maxsize=2)
def _empty_dir(purpose: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"glmserve-locust-{purpose}-"))


def locust_env() -> dict[str, str]:
    """The environment for a Locust under test: without the user's LOCUST_* settings and with a
    HOME of its own (Locust reads ~/.locust.conf), so only what a test passes counts."""
    home = _empty_dir("home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")}
    env["HOME"] = str(home)
    return env


def locust_cwd() -> Path:
    """A folder with no locust.conf or pyproject.toml for Locust to read (the checkout has a
    pyproject.toml, and a user may keep a locust.conf there)."""
    return _empty_dir("cwd")


def run_locust(host: str, report: Path, *args: str, timeout_s: float = 90) -> LocustRun:
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-H", host,
            "--report-dir", str(report), "--only-summary", *args]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                          cwd=locust_cwd(), env=locust_env())  # fmt: skip
    return LocustRun(proc.returncode, proc.stdout + proc.stderr, report)
