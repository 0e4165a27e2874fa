"""The exporter against the real emulator process over loopback: kill -9 and restart it.

The emulator speaks SGLang's protocol (role chunk, continuous usage, /server_info), so this is
the closest to production the exporter gets without a GPU.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.exporter import failures, tpot_count, value, wait_for
from support.livestack import start_emulator
from support.net import free_port

from glmserve.exporter.cli import Exporter, start
from glmserve.exporter.config import ExporterConfig

EMU_ARGS = ["--tpot-ms", "5", "--ttft-ms", "20"]


@pytest.fixture
def emulator_port() -> Iterator[int]:
    yield free_port()


@pytest.fixture
def exporter(emulator_port: int, tmp_path: Path) -> Iterator[Exporter]:
    running = start(
        ExporterConfig(
            target=f"http://127.0.0.1:{emulator_port}",
            listen_address="127.0.0.1:0",
            canary_interval_s=0.2,
            canary_max_tokens=8,
            canary_timeout_s=5.0,
            probe_timeout_s=2.0,
            probe_interval_s=0.1,
            build_info_file=str(tmp_path / "build-info.json"),
        )
    )
    yield running
    running.stop()


def test_kill_9_and_restart_the_emulator(emulator_port: int, exporter: Exporter, tmp_path):
    build = ["--build-info-file", str(tmp_path / "build-info.json")]
    emu = start_emulator(emulator_port, [*EMU_ARGS, *build])
    try:
        s = wait_for(exporter.port, lambda s: tpot_count(s) >= 2, timeout_s=30)
        assert value(s, "glmserve_target_up") == 1
        info = next(k for k in s if k[0] == "glmserve_server_info")
        labels = dict(info[1])
        assert labels["summary"] == "FP8 KV, unpatched, pool 495k"
        assert labels["tp_size"] == "8" and labels["attention_backend"] == "flashinfer"
        # Every canary token is accounted for: usage says 8 per request.
        assert value(s, "glmserve_canary_output_tokens_total") % 8 == 0

        os.kill(emu.pid, signal.SIGKILL)
        emu.stop()  # reaps the killed process
        s = wait_for(exporter.port, lambda s: value(s, "glmserve_target_up") == 0, timeout_s=30)
        s = wait_for(exporter.port, lambda s: failures(s, "connect") >= 1, timeout_s=30)
        # The last known build info stays visible while the target is down.
        assert any(k[0] == "glmserve_server_info" for k in s)
        before = tpot_count(s)

        emu = start_emulator(emulator_port, [*EMU_ARGS, *build])
        s = wait_for(
            exporter.port,
            lambda s: tpot_count(s) > before and value(s, "glmserve_target_up") == 1,
            timeout_s=30,
        )
    finally:
        emu.stop()
