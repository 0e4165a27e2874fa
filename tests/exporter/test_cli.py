"""Flags over environment over config file over defaults; bad input is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from glmserve.exporter.cli import load_config
from glmserve.exporter.config import ConfigError, ExporterConfig, env_name, parse_duration


def test_defaults_match_the_contract_ports():
    config, _ = load_config([], {})
    assert config == ExporterConfig()
    assert config.target == "http://127.0.0.1:30000"
    assert config.listen_address == "127.0.0.1:9464"
    assert (config.canary_interval_s, config.canary_max_tokens) == (15.0, 64)


def test_env_overrides_file_and_flags_override_env(tmp_path):
    path = tmp_path / "exporter.json"
    path.write_text(
        json.dumps({"canary.interval": "1m", "canary.max-tokens": 32, "target": "http://a:1"})
    )
    env = {env_name("canary.interval"): "30s", env_name("canary.prompt"): "hi"}
    config, _ = load_config(["--config.file", str(path), "--canary.prompt", "flag"], env)
    assert config.canary_interval_s == 30.0  # env beats file
    assert config.canary_max_tokens == 32  # file beats default
    assert config.target == "http://a:1"
    assert config.canary_prompt == "flag"  # flag beats env


def test_config_file_can_come_from_the_environment(tmp_path):
    path = tmp_path / "exporter.json"
    path.write_text(json.dumps({"canary.enabled": False}))
    config, _ = load_config([], {env_name("config.file"): str(path)})
    assert config.canary_enabled is False


def test_build_info_path_honours_the_project_variable():
    config, _ = load_config([], {"GLMSERVE_BUILD_INFO": "/x/build.json"})
    assert config.build_info_file == "/x/build.json"
    config, _ = load_config(["--build-info.file", "/y.json"], {"GLMSERVE_BUILD_INFO": "/x"})
    assert config.build_info_file == "/y.json"


def test_no_canary_flag():
    config, _ = load_config(["--no-canary.enabled"], {})
    assert config.canary_enabled is False


@pytest.mark.parametrize(
    ("text", "seconds"), [("15s", 15.0), ("500ms", 0.5), ("1m", 60.0), ("2h", 7200.0), ("3", 3.0)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--canary.interval", "soon"], {}, "canary.interval"),
        (["--canary.interval", "0s"], {}, "positive"),
        # inf once overflowed the canary thread's wait and left a dead canary behind /metrics.
        (["--canary.interval", "inf"], {}, "finite"),
        (["--canary.timeout", "1e400"], {}, "finite"),
        (["--probe.interval", "nan"], {}, "finite"),
        ([], {env_name("probe.timeout"): "Infinity"}, "environment: probe.timeout"),
        (["--canary.max-tokens", "1"], {}, "canary.max-tokens"),
        (["--canary.max-tokens", "many"], {}, "not an integer"),
        (["--target", "127.0.0.1:30000"], {}, "target"),
        (["--web.listen-address", "9464"], {}, "web.listen-address"),
        (["--canary.route", "grpc"], {}, "canary.route"),
        ([], {env_name("canary.enabled"): "maybe"}, "environment: canary.enabled"),
    ],
)
def test_bad_values_are_one_clear_config_error(argv, env, needle):
    with pytest.raises(ConfigError) as err:
        load_config(argv, env)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_bad_config_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  'target': 1\n}")
    with pytest.raises(ConfigError, match="invalid JSON at line 2"):
        load_config(["--config.file", str(bad)], {})
    bad.write_text(json.dumps({"canary.intervall": "1s"}))
    with pytest.raises(ConfigError, match=r"unknown setting 'canary\.intervall'"):
        load_config(["--config.file", str(bad)], {})
    with pytest.raises(ConfigError, match="not found"):
        load_config(["--config.file", str(tmp_path / "nope.json")], {})


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--canary.interval=-5s"], "canary.interval"),
        (["--canary.interval"], "expected one argument"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_cli_exits_2_with_one_line_on_bad_input(argv, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "glmserve.exporter", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glmserve-exporter: error:"), lines
    assert needle in lines[0]


def test_busy_listen_address_is_one_line_and_exit_1():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "glmserve.exporter", f"--web.listen-address=127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot listen on" in lines[0], lines
