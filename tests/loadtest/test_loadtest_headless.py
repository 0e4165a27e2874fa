"""Headless Locust runs of loadtest/decode.py against a local SSE server (subprocesses)."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.locust_run import LOCUSTFILE, ROOT, SSE_SERVER, locust_cwd, locust_env, run_locust

SHORT = ["--warmup-s", "0.5", "--measure-s", "3", "--read-timeout-s", "1"]


def test_every_failure_is_counted_with_its_reason_and_the_run_survives(
    sse_server, tmp_path: Path
) -> None:
    """HTTP errors, broken streams, malformed SSE, error events and timeouts are failures with a
    reason; good streams in between are still timed and Locust exits 1 (failures), not 2."""
    url = (
        sse_server()
    )  # cycles ok, http_status, broken_stream, malformed_sse, stream_error, timeout
    run = run_locust(url, tmp_path / "rep", "-u", "3", *SHORT, "--csv", str(tmp_path / "loc"))
    assert run.returncode == 1, run.output[-3000:]
    summary = run.summary
    assert set(summary["failures_total"]) == {
        "http_status", "broken_stream", "malformed_sse", "stream_error", "timeout",
    }  # fmt: skip
    step = summary["steps"][0]
    assert step["requests"] > 0
    assert step["output_tokens_per_request"]["p50"] == 8  # from usage, not chunk counting
    assert step["tpot_ms"]["p50"] > 0
    assert "Traceback" not in run.output
    # Locust's own table: the stream metrics under their own type, the HTTP entry apart.
    rows = list(csv.DictReader((tmp_path / "loc_stats.csv").open()))
    names = {(r["Type"], r["Name"]) for r in rows}
    assert {("STREAM", n) for n in ("ack", "TTFT", "TPOT", "ITL", "e2e")} <= names
    assert ("POST", "/v1/chat/completions") in names
    post = next(r for r in rows if r["Type"] == "POST")
    stream_e2e = next(r for r in rows if r["Name"] == "e2e")
    assert int(post["Failure Count"]) > 0 and int(stream_e2e["Failure Count"]) == 0
    # The HTTP entry's time is the whole request (the body too), not just the headers.
    assert float(post["Max Response Time"]) >= float(stream_e2e["Min Response Time"])
    reports = {p.name for p in (tmp_path / "rep").iterdir()}
    assert {"summary.json", "steps.csv", "requests.csv", "latency_histograms.png"} <= reports


def test_dead_target_at_start_is_one_line_exit_2_and_no_report(tmp_path: Path) -> None:
    """Nothing listens: refuse before any load, rather than fill a report with failures."""
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = run_locust(f"http://127.0.0.1:{port}", tmp_path / "rep", "-u", "1", "--warmup-s", "0",
                     "--measure-s", "1.5")  # fmt: skip
    assert run.returncode == 2, run.output[-3000:]
    assert f"target http://127.0.0.1:{port} is not reachable" in run.output
    assert "Traceback" not in run.output
    assert not (tmp_path / "rep").exists()


def test_target_dying_mid_run_is_counted_as_connect_failures(tmp_path: Path) -> None:
    """A server that goes away during the run: requests after that are `connect` failures."""
    port_file = tmp_path / "port"
    server = subprocess.Popen([sys.executable, str(SSE_SERVER), str(port_file), "ok"])
    try:
        deadline = time.monotonic() + 20
        while not (port_file.exists() and port_file.read_text()):
            assert server.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text()}"
        argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-H", url,
                "--report-dir", str(tmp_path / "rep"), "--only-summary", "-u", "1",
                "--warmup-s", "0", "--measure-s", "4"]  # fmt: skip
        locust = subprocess.Popen(argv, cwd=locust_cwd(), env=locust_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)  # fmt: skip
        time.sleep(2.0)
        server.terminate()
        server.wait(10)
        output = locust.communicate(timeout=60)[0].decode()
    finally:
        if server.poll() is None:
            server.kill()
    assert locust.returncode == 1, output[-3000:]
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert "connect" in summary["failures_total"]
    assert summary["steps"][0]["requests"] > 0  # the streams before the server died were timed
    # Backed off, not a tight loop: ~2 s after the death at 0.1, 0.2, 0.4, 0.8 s pauses is
    # about 5 failed connects (thousands without the backoff).
    assert summary["failures_total"]["connect"] <= 15, summary["failures_total"]


def test_sigterm_mid_run_still_writes_the_report_marked_incomplete(sse_server, tmp_path):
    """docker stop / a CI timeout: Locust's own SIGTERM handler is not installed while a
    headless shape runs, so the suite stops the run itself and the report is written."""
    url = sse_server("ok")
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-H", url,
            "--report-dir", str(tmp_path / "rep"), "--only-summary", "-u", "2",
            "--warmup-s", "0.5", "--measure-s", "60"]  # fmt: skip
    locust = subprocess.Popen(argv, cwd=locust_cwd(), env=locust_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)  # fmt: skip
    time.sleep(4.0)
    locust.send_signal(signal.SIGTERM)
    output = locust.communicate(timeout=60)[0].decode()
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["complete"] is False and summary["stopped_by"] == "SIGTERM", output[-2000:]
    assert locust.returncode == 5, output[-2000:]  # incomplete: not to be taken for a whole run
    assert summary["steps"][0]["requests"] > 0  # what was measured is kept
    assert "report marked incomplete" in output


def test_run_time_is_honoured_and_the_report_says_so(sse_server, tmp_path: Path) -> None:
    url = sse_server("ok")
    run = run_locust(url, tmp_path / "rep", "--shape", "sweep", "-u", "8", "--warmup-s", "0.5",
                     "--measure-s", "1.5", "-t", "4")  # fmt: skip
    assert run.returncode == 5, run.output[-3000:]  # incomplete (docs/loadtest.md, exit codes)
    assert run.summary["complete"] is False and run.summary["stopped_by"] == "--run-time 4 s"
    assert [s["streams"] for s in run.summary["steps"]] == [1, 2]  # 4 and 8 never started
    whole = run_locust(url, tmp_path / "whole", "-u", "1", *SHORT)
    assert whole.summary["complete"] is True and whole.summary["stopped_by"] is None


def test_slo_breach_exits_3_and_a_met_slo_exits_0(sse_server, tmp_path: Path) -> None:
    """The exit code gates on the chosen percentile: TPOT is ~10 ms on the test server."""
    url = sse_server("ok")
    bad = run_locust(url, tmp_path / "bad", "-u", "2", *SHORT, "--slo-tpot-ms", "0.5")
    assert bad.returncode == 3, bad.output[-3000:]
    assert bad.summary["slo"]["passed"] is False
    assert bad.summary["steps"][0]["goodput_rps"] == 0.0
    good = run_locust(url, tmp_path / "good", "-u", "2", *SHORT, "--slo-tpot-ms", "5000",
                      "--slo-ttft-ms", "5000", "--slo-percentile", "99")  # fmt: skip
    assert good.returncode == 0, good.output[-3000:]
    assert good.summary["slo"]["passed"] is True
    step = good.summary["steps"][0]
    assert step["goodput_rps"] == step["requests_per_s"] > 0


def test_sweep_with_two_processes_measures_each_step_and_plots(sse_server, tmp_path: Path) -> None:
    """The shape runs on the master, streams in the workers: their records reach the master's
    step windows (1, 2, 4 streams), and the sweep plot is drawn."""
    url = sse_server("ok")
    run = run_locust(url, tmp_path / "rep", "--shape", "sweep", "-u", "4", "--warmup-s", "0.5",
                     "--measure-s", "2", "--seed", "1", "--processes", "2")  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    steps = run.summary["steps"]
    assert [s["streams"] for s in steps] == [1, 2, 4]
    assert all(s["requests"] > 0 for s in steps)
    assert (tmp_path / "rep" / "sweep.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("host", "args", "line"),
    [
        ("http://127.0.0.1:1", ["--max-tokens", "0"], "--max-tokens must be >= 1"),
        # -u 0 once ran one stream; -H ftp:// once ran 0 requests and called itself complete.
        ("http://127.0.0.1:1", ["-u", "0"], "-u/--users must be >= 1, got 0"),
        ("ftp://127.0.0.1:21", [], "target 'ftp://127.0.0.1:21' is not an http:// or https://"),
    ],
)
def test_bad_option_is_one_line_and_exit_2(tmp_path: Path, host, args, line) -> None:
    run = run_locust(host, tmp_path / "rep", *args)
    assert run.returncode == 2, run.output[-2000:]
    assert line in run.output
    assert "Traceback" not in run.output
    assert not (tmp_path / "rep").exists()


PARSE = """
import sys
import glmserve.loadtest.plugin as p
p.register()
from locust.argument_parser import get_parser
ns = get_parser(default_config_files=[]).parse_args(sys.argv[2:])
print(getattr(ns, sys.argv[1]))
"""


def bind_host(dest: str, *args: str, env_var: str, env_host: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != env_var}
    env["PYTHONPATH"] = str(ROOT / "src")  # this checkout's glmserve
    if env_host is not None:
        env[env_var] = env_host
    out = subprocess.run([sys.executable, "-c", PARSE, dest, *args], capture_output=True,
                         text=True, env=env, check=True)  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("dest", "flag", "env_var"),
    [
        ("web_host", "--web-host", "LOCUST_WEB_HOST"),  # the web UI
        ("master_bind_host", "--master-bind-host", "LOCUST_MASTER_BIND_HOST"),  # workers' port
    ],
)
def test_what_locust_listens_on_is_loopback_unless_told_otherwise(dest, flag, env_var) -> None:
    """Locust's default is every interface; ours is 127.0.0.1. A flag or the variable wins."""
    assert bind_host(dest, env_var=env_var) == "127.0.0.1"
    assert bind_host(dest, flag, "0.0.0.0", env_var=env_var) == "0.0.0.0"
    assert bind_host(dest, env_var=env_var, env_host="10.1.2.3") == "10.1.2.3"


REGISTER = """
import importlib.metadata as md, sys
real, fake = md.version, {fake!r}
if fake:  # what importlib.metadata would report for another installed release
    md.version = lambda name: fake if name == "geventhttpclient" else real(name)
import glmserve.loadtest.plugin as p
from glmserve.loadtest.users import GEVENTHTTPCLIENT_VERSION
print(GEVENTHTTPCLIENT_VERSION, flush=True)
p.register()
print("registered")
"""


def register_with(fake: str | None) -> subprocess.CompletedProcess[str]:
    code = REGISTER.format(fake=fake)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}  # this checkout's glmserve
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )


PINNED_GEVENTHTTPCLIENT = next(
    line.split("==")[1].strip()
    for line in (ROOT / "constraints.txt").read_text().splitlines()
    if line.startswith("geventhttpclient==")
)


@pytest.mark.parametrize("fake", ["2.6.0", "3.0.0"])
def test_register_refuses_another_geventhttpclient_with_one_line(fake: str) -> None:
    """The stream reader reads geventhttpclient internals: any other release is refused."""
    proc = register_with(fake)
    assert proc.returncode != 0 and "registered" not in proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert f"needs geventhttpclient=={PINNED_GEVENTHTTPCLIENT}" in line and f"found {fake}" in line


def test_register_accepts_the_pinned_geventhttpclient() -> None:
    """The version the check wants is the one constraints.txt installs."""
    proc = register_with(None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [PINNED_GEVENTHTTPCLIENT, "registered"]
