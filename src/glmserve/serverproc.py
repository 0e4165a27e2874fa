"""One SGLang (or emulator) server as a child process: start it, wait for /health, stop it.

Used by the operator smoke test (`glmserve.smoke`) and the e2e benchmark (bench/e2e/harness.py),
so both start and stop servers the same way. Stdlib only: it runs in the server image.

The child gets its own session, so stopping the group also reaches what SGLang forks (scheduler,
detokenizer, TP workers). A run killed from outside cannot stop its children; `pid_file`
records each group id so the next run can (bench/e2e/device.sh does).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from glmserve import sglang_api


def free_port() -> int:
    """A 127.0.0.1 port that was free a moment ago (for servers that need the port up front)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        url: str,
        pid_file: str | None = None,
    ) -> None:
        self.argv, self.env, self.log_path = list(argv), dict(env), Path(log_path)
        self.url = url.rstrip("/")
        self.pid_file = pid_file
        self.proc: subprocess.Popen[bytes] | None = None
        self.t_start = 0.0
        self.ready_s: float | None = None
        self.error: str | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it for its lifetime
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        fh.close()
        if self.pid_file:
            with open(self.pid_file, "a") as f:
                f.write(f"{self.proc.pid}\n")

    def poll_ready(self, timeout_s: float = 2.0) -> bool:
        """True once GET /health answers 200 (SGLang: after its own warm-up request). Sets
        `error` (and stays False) when the process has exited instead."""
        if self.ready_s is not None:
            return True
        if self.error:
            return False
        assert self.proc is not None, "start() first"
        if self.proc.poll() is not None:
            self.error = f"exited with {self.proc.returncode} before ready; tail: {self.tail()}"
            return False
        try:
            with urllib.request.urlopen(self.url + sglang_api.HEALTH, timeout=timeout_s) as resp:
                ok = resp.status == 200
        except (OSError, urllib.error.URLError):
            return False
        if ok:
            self.ready_s = time.monotonic() - self.t_start
        return ok

    def wait_ready(self, budget_s: float, poll_s: float = 0.5) -> bool:
        end = time.monotonic() + budget_s
        while time.monotonic() < end:
            if self.poll_ready():
                return True
            if self.error:
                return False
            time.sleep(poll_s)
        self.error = f"not ready within {budget_s:.0f} s; tail: {self.tail()}"
        return False

    def tail(self, n: int = 400) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace").replace("\n", " | ")
        except OSError:
            return ""

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def reap(self, deadline: float) -> None:
        """Wait until `deadline` (monotonic) for the group leader, then kill the whole group."""
        if self.proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        # SGLang's children (scheduler, detokenizer) share the group: kill whatever is left.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def stop(self, grace_s: float = 15.0) -> None:
        self.terminate()
        self.reap(time.monotonic() + grace_s)


def stop_all(servers: Sequence[ServerProcess], grace_s: float = 15.0) -> None:
    """SIGTERM every server first, then reap them against one shared grace period."""
    for srv in servers:
        srv.terminate()
    deadline = time.monotonic() + grace_s
    for srv in servers:
        srv.reap(deadline)
