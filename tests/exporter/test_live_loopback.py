"""The exporter over real sockets: a fake SGLang that dies, comes back and misbehaves.

/metrics must keep answering throughout, report `glmserve_target_up 0` while the target is
gone, count each fault under its reason and recover with no restart of the exporter.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from support.exporter import failures, scrape, tpot_count, value, wait_for
from support.net import free_port
from support.sse import SSEServer

from glmserve.exporter.cli import Exporter, start
from glmserve.exporter.config import ExporterConfig


@pytest.fixture
def fake() -> Iterator[SSEServer]:
    # A 3 s stall outlasts the canary's 1 s timeout without keeping a thread around for long.
    with SSEServer(stall_s=3.0) as server:
        yield server


@pytest.fixture
def exporter(fake: SSEServer, tmp_path) -> Iterator[Exporter]:
    config = ExporterConfig(
        target=fake.url,
        listen_address="127.0.0.1:0",
        canary_interval_s=0.1,
        canary_max_tokens=fake.n_tokens,
        canary_timeout_s=1.0,
        probe_timeout_s=1.0,
        probe_interval_s=0.1,
        build_info_file=str(tmp_path / "absent.json"),
    )
    running = start(config)
    yield running
    running.stop()


def test_kill_and_restart_target(fake: SSEServer, exporter: Exporter):
    port = exporter.port
    s = wait_for(port, lambda s: tpot_count(s) >= 2 and value(s, "glmserve_target_up") == 1)
    assert 0 < value(s, "glmserve_canary_tpot_seconds_sum") / tpot_count(s) < 0.5
    fake.stop()
    s = wait_for(port, lambda s: failures(s, "connect") >= 2)
    assert value(s, "glmserve_target_up") == 0
    assert value(s, "glmserve_target_probe_failures_total", reason="connect") >= 1
    before = tpot_count(s)
    fake.start()  # same port: the exporter must find it again by itself
    s = wait_for(port, lambda s: tpot_count(s) > before and value(s, "glmserve_target_up") == 1)


@pytest.mark.parametrize(
    "reason", ["http_status", "broken_stream", "malformed_sse", "stream_error", "timeout"]
)
def test_faults_over_real_sockets_are_counted_by_reason(fake, exporter, reason):
    fake.set_modes(reason)  # each fault mode is named after the reason it must be counted as
    s = wait_for(exporter.port, lambda s: failures(s, reason) >= 1)
    assert value(s, "glmserve_target_up") == 1  # /server_info still answers
    fake.set_modes("ok")
    before = tpot_count(s)
    wait_for(exporter.port, lambda s: tpot_count(s) > before)


@pytest.mark.parametrize("log_level", ["info", "debug"])
def test_module_entry_point_serves_and_stops_on_sigterm(fake: SSEServer, tmp_path, log_level):
    """...and logs each HTTP request it makes only at --log.level debug."""
    port = free_port()
    env = {**os.environ, "GLMSERVE_EXPORTER_CANARY_INTERVAL": "200ms"}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "glmserve.exporter",
            "--target", fake.url,
            "--web.listen-address", f"127.0.0.1:{port}",
            "--canary.max-tokens", "4",
            "--build-info.file", str(tmp_path / "none.json"),
            "--log.level", log_level,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                s = scrape(port)
                if tpot_count(s) >= 1:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "exporter did not serve a canary result in 30 s"
            time.sleep(0.1)
        assert value(s, "glmserve_target_up") == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=15)
    assert rc == 0
    log = proc.stdout.read() if proc.stdout else ""
    assert "serving /metrics" in log
    assert ("HTTP Request: " in log) == (log_level == "debug"), log
