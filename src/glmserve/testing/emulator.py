"""Start an emulator for a test: in this process (a thread) or as a subprocess, on a free port.

    from glmserve.testing.emulator import emulator_thread, emulator_process

    with emulator_thread(tpot_ms=5, ttft_ms=10) as emu:      # EmulatorConfig fields
        httpx.get(emu.url + "/v1/models")
        emu.engine.running                                    # in-thread: engine inspectable

    with emulator_process(["--tpot-ms", "5", "--ttft-ms", "10"]) as emu:   # CLI flags
        ...  emu.url, emu.pid

Both bind 127.0.0.1 port 0 (no collisions between concurrent test runs), wait until the server
accepts connections, and stop it on exit (thread: graceful shutdown; process: SIGTERM, then
SIGKILL after a grace period, by PID). Defaults differ from the CLI in one place: the health
endpoints answer at once (health_delay_s=0) unless asked otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from glmserve.emulator.config import EmulatorConfig
from glmserve.emulator.engine import Engine
from glmserve.emulator.server import READY_PREFIX, bind_socket, make_server, url_of


@dataclasses.dataclass
class RunningEmulator:
    """A started emulator: `url` (http://127.0.0.1:PORT), `config`, and for threads `engine`."""

    url: str
    config: EmulatorConfig | None
    engine: Engine | None = None
    pid: int | None = None
    _stop: Any = None

    def stop(self) -> None:
        if self._stop is not None:
            stop, self._stop = self._stop, None
            stop()


def start_thread(config: EmulatorConfig | None = None, **overrides: Any) -> RunningEmulator:
    """Serve in a daemon thread with its own event loop. Call .stop() (or use emulator_thread)."""
    base = config or EmulatorConfig(health_delay_s=0.0)
    cfg = dataclasses.replace(base, host="127.0.0.1", port=0, **overrides)
    sock = bind_socket(cfg.host, 0)
    url = url_of(sock)
    ready = threading.Event()
    holder: dict[str, Any] = {}
    errors: list[BaseException] = []

    def target() -> None:
        loop = asyncio.new_event_loop()
        try:
            server = make_server(cfg, on_ready=ready.set)
            holder["server"] = server
            holder["engine"] = server.config.app.state.emulator.engine
            loop.run_until_complete(server.serve(sockets=[sock]))
        except BaseException as exc:  # surfaced to the caller of start_thread
            errors.append(exc)
        finally:
            ready.set()
            loop.close()

    thread = threading.Thread(target=target, name="glmserve-emulator", daemon=True)
    thread.start()
    if not ready.wait(15) or errors or not holder.get("server"):
        raise RuntimeError(f"emulator thread did not start: {errors}")
    if not holder["server"].started:
        raise RuntimeError(f"emulator thread did not start: {errors}")

    def stop() -> None:
        holder["server"].should_exit = True
        thread.join(10)
        sock.close()

    return RunningEmulator(url=url, config=cfg, engine=holder["engine"], _stop=stop)


@contextlib.contextmanager
def emulator_thread(
    config: EmulatorConfig | None = None, **overrides: Any
) -> Iterator[RunningEmulator]:
    emu = start_thread(config, **overrides)
    try:
        yield emu
    finally:
        emu.stop()


def start_process(
    args: Sequence[str],
    *,
    python: str = sys.executable,
    timeout_s: float = 20.0,
    env: dict[str, str] | None = None,
    port: int = 0,
) -> RunningEmulator:
    """`python -m glmserve.emulator ARGS --host 127.0.0.1 --port PORT`; waits for its ready line.

    The default port 0 picks a free one; a fixed port lets a restarted emulator come back
    where a client (an exporter under test) already looks.
    """
    argv = [python, "-m", "glmserve.emulator", *args, "--host", "127.0.0.1", "--port", str(port)]
    if not any(a.startswith("--health-delay-s") for a in args):
        argv += ["--health-delay-s", "0"]
    # stderr goes to a file: a pipe nobody drains would block a chatty server.
    errlog = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by stop())
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=errlog,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        url = _wait_ready(proc, timeout_s)
    except RuntimeError as exc:
        errlog.seek(0)
        raise RuntimeError(f"{exc}: {errlog.read()[-2000:]}") from None

    def stop() -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
        errlog.close()

    return RunningEmulator(url=url, config=None, pid=proc.pid, _stop=stop)


def _wait_ready(proc: subprocess.Popen[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    result: list[str] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(READY_PREFIX):
                result.append(line[len(READY_PREFIX) :].strip())
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(max(0.0, deadline - time.monotonic()))
    if result:
        return result[0]
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)
    raise RuntimeError(f"emulator process did not become ready in {timeout_s:g} s")


@contextlib.contextmanager
def emulator_process(args: Sequence[str], **kwargs: Any) -> Iterator[RunningEmulator]:
    emu = start_process(args, **kwargs)
    try:
        yield emu
    finally:
        emu.stop()


__all__ = [
    "RunningEmulator",
    "emulator_process",
    "emulator_thread",
    "start_process",
    "start_thread",
]
