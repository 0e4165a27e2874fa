"""The command line: the documented flags, one clear line on bad input, build info, subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from glmserve.emulator.config import parse_config
from glmserve.testing.emulator import emulator_process


def test_documented_invocation_parses():
    cfg, _ = parse_config(
        [
            "--host",
            "127.0.0.1",
            "--port",
            "30000",
            "--tpot-ms",
            "20",
            "--ttft-ms",
            "150",
            "--tokens-per-chunk",
            "3",
            "--max-concurrency",
            "64",
            "--cost-model",
            "patched",
            "--layers",
            "78",
            "--pool-tokens",
            "400000",
            "--no-role-chunk",
            "--gather-tbps",
            "3.1",
        ]
    )
    assert (cfg.tpot_ms, cfg.ttft_ms, cfg.tokens_per_chunk, cfg.max_concurrency) == (20, 150, 3, 64)
    assert cfg.cost_model.mode == "patched" and cfg.cost_model.pool_rows == 400_000
    assert cfg.role_chunk is False
    assert cfg.cost_model.gather_bytes_per_s == pytest.approx(3.1e12)
    assert cfg.model_name == cfg.model_path  # served name defaults to the model path


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tpot-ms", "0", "--ttft-ms", "1"], "--tpot-ms must be > 0"),
        (["--tpot-ms", "1", "--ttft-ms", "1", "--tokens-per-chunk", "0"], "--tokens-per-chunk"),
        (["--tpot-ms", "1"], "--ttft-ms"),
        (["--tpot-ms", "1", "--ttft-ms", "1", "--cost-model", "fast"], "--cost-model"),
        (["--tpot-ms", "1", "--ttft-ms", "1", "--served-model-name", "a:b"], "colon"),
        # Each of these once printed a 15-29 line traceback, or was accepted.
        (["--tpot-ms", "1", "--ttft-ms", "1", "--port", "70000"], "--port must be 0-65535"),
        (["--tpot-ms", "1", "--ttft-ms", "1", "--log-level", "shouty"], "--log-level"),
        (["--tpot-ms", "inf", "--ttft-ms", "1"], "--tpot-ms must be > 0 and finite"),
        (["--tpot-ms", "1", "--ttft-ms", "nan"], "--ttft-ms must be >= 0 and finite"),
        (["--tpot-ms", "1", "--ttft-ms", "1", "--health-delay-s", "-1"], "--health-delay-s"),
        (["--tpot-ms", "1", "--ttft-ms", "1", "--gather-tbps", "inf"], "finite"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args, needle):
    r = subprocess.run(
        [sys.executable, "-m", "glmserve.emulator", *args], capture_output=True, text=True
    )
    assert r.returncode == 2
    [line] = r.stderr.strip().splitlines()  # one line, no usage block
    assert line.startswith("python -m glmserve.emulator: error: ") and needle in line


def test_an_unwritable_build_info_file_is_one_line_and_exit_1(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the build-info folder should be
    r = subprocess.run(
        [sys.executable, "-m", "glmserve.emulator", "--tpot-ms", "1", "--ttft-ms", "1",
         "--port", "0", "--build-info-file", str(blocker / "build-info.json")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("glmserve-emulator: cannot write --build-info-file ")


def test_subprocess_serves_and_writes_build_info(tmp_path):
    info = tmp_path / "run" / "build-info.json"
    args = ["--tpot-ms", "1", "--ttft-ms", "1", "--cost-model", "patched"]
    with emulator_process([*args, "--build-info-file", str(info)]) as emu:
        assert emu.pid is not None
        body = {"prompt": "x", "max_tokens": 3, "ignore_eos": True}
        out = httpx.post(emu.url + "/v1/completions", json=body, timeout=30).json()
        assert out["usage"]["completion_tokens"] == 3
        server = httpx.get(emu.url + "/get_server_info", timeout=10).json()
        assert server["glmserve_emulator"]["cost_model"] == "patched"
    record = json.loads(info.read_text())
    assert record["source"] == "emulator"
    assert record["fp8_gather"] == "on"
    assert record["patch_series"] == "emulated"  # never a real series name: nothing was patched
    assert record["patch_lock_sha256"] == ""
    assert record["sglang_version"] == "0.5.12.post1"
