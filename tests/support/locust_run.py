"""Headless runs of loadtest/decode.py for the Locust suite's end-to-end tests.

Locust runs in a subprocess: importing it here would gevent-patch the whole pytest process.
"""

from __future__ import annotations

import json
import subprocess
import sys
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


def run_locust(host: str, report: Path, *args: str, timeout_s: float = 90) -> LocustRun:
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-H", host,
            "--report-dir", str(report), "--only-summary", *args]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    return LocustRun(proc.returncode, proc.stdout + proc.stderr, report)
