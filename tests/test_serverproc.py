"""glmserve.serverproc: the one way the smoke test and the e2e harness start and stop servers."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from glmserve.serverproc import ServerProcess, stop_all

NOBODY = "http://127.0.0.1:1"  # nothing listens on port 1: every /health probe is refused


def test_a_server_that_exits_before_ready_reports_why(tmp_path):
    code = "import sys; print('unknown flag --nope'); sys.exit(3)"
    srv = ServerProcess([sys.executable, "-c", code], {}, tmp_path / "log", NOBODY)
    srv.start()
    assert srv.wait_ready(budget_s=30) is False
    assert "exited with 3" in srv.error and "unknown flag --nope" in srv.error


def test_a_server_that_never_answers_times_out_and_its_whole_group_is_stopped(tmp_path):
    """SGLang forks its scheduler and detokenizer: stopping must reach the grandchildren."""
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "time.sleep(120)"
    )
    srv = ServerProcess([sys.executable, "-c", code], {}, tmp_path / "log", NOBODY)
    srv.start()
    assert srv.wait_ready(budget_s=0.5, poll_s=0.1) is False
    assert "not ready within" in srv.error
    stop_all([srv], grace_s=5)
    assert srv.proc is not None and srv.proc.poll() is not None
    # nothing of the group runs on (SIGKILL lands asynchronously: a loaded machine may show the
    # orphan for a moment after stop_all returns)
    deadline = time.monotonic() + 5
    while _live_members(srv.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _live_members(srv.proc.pid) == []


def _live_members(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies (an orphan killed here may wait a moment
    for init to reap it; it runs no more)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(stat.parent.name))
    return live
