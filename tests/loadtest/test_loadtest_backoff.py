"""Locust against sick targets: every failure kind backs off (issue 21).

Rule: at most 2 failed requests per second per user against any sick target, whatever the
failure (measured before this rule: 4,014/s from 8 users against malformed SSE, 1,747/s against a
server that accepts and closes); and requests.csv stays bounded however many requests fail.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from support.locust_run import run_locust

FAULTY_SERVER = Path(__file__).parents[1] / "support" / "faulty.py"
USERS = 4
BOUND_PER_USER_S = 2.0


@pytest.fixture
def faulty(tmp_path: Path):
    procs: list[subprocess.Popen[bytes]] = []

    def start(mode: str) -> str:
        port_file = tmp_path / f"faulty-{mode}"
        proc = subprocess.Popen([sys.executable, str(FAULTY_SERVER), str(port_file), mode])
        procs.append(proc)
        deadline = time.monotonic() + 20
        while not (port_file.exists() and port_file.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the faulty test server did not start")
            time.sleep(0.05)
        return f"http://127.0.0.1:{port_file.read_text()}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def failed_per_user_s(summary: dict) -> float:
    span = datetime.fromisoformat(summary["finished_at"]) - datetime.fromisoformat(
        summary["started_at"]
    )
    return sum(summary["failures_total"].values()) / USERS / span.total_seconds()


@pytest.mark.parametrize(
    ("target", "reason"),
    [("malformed_sse", "malformed_sse"), ("accept_close", "broken_stream")],
)
def test_a_sick_target_costs_at_most_two_failed_requests_per_second_per_user(
    target, reason, faulty, sse_server, tmp_path
):
    url = sse_server("malformed_sse") if target == "malformed_sse" else faulty(target)
    run = run_locust(url, tmp_path / "rep", "-u", str(USERS), "--warmup-s", "0.5",
                     "--measure-s", "8", "--read-timeout-s", "2")  # fmt: skip
    assert run.returncode == 1, run.output[-3000:]  # failures, and nothing else went wrong
    summary = run.summary
    assert set(summary["failures_total"]) == {reason}, summary["failures_total"]
    rate = failed_per_user_s(summary)
    assert 0 < rate <= BOUND_PER_USER_S, (rate, summary["failures_total"])
    rows = list(csv.DictReader((tmp_path / "rep" / "requests.csv").open()))
    assert sum(int(r["count"]) for r in rows) == sum(summary["failures_total"].values())
    print(f"{target}: {rate:.2f} failed requests/s per user ({summary['failures_total']})")
