"""What a user of the Locust suite sees: the SLO verdict on screen, the suite's options in
`--help`, the option named in a bad value, an unwritable --report-dir refused before the run,
the status code of a refused request in Locust's failure table, and no worker process left
behind by a refused run."""

from __future__ import annotations

import csv
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.locust_run import ROOT, run_locust

from glmserve.loadtest.options import EXIT_SLO_BREACH

SHORT = ["--warmup-s", "0.5", "--measure-s", "2", "--read-timeout-s", "1"]


def verdicts(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("locust decode suite: SLO ")]


def test_the_slo_verdict_is_on_screen(sse_server, tmp_path: Path) -> None:
    url = sse_server("ok")
    good = run_locust(url, tmp_path / "good", "-u", "2", *SHORT, "--slo-tpot-ms", "5000")
    assert good.returncode == 0, good.output[-2000:]
    (line,) = verdicts(good.output)
    assert line.startswith("locust decode suite: SLO met: p90 TPOT <= 5000 ms in every measured")
    bad = run_locust(url, tmp_path / "bad", "-u", "2", *SHORT, "--slo-tpot-ms", "0.5",
                     "--slo-ttft-ms", "5000")  # fmt: skip
    assert bad.returncode == EXIT_SLO_BREACH, bad.output[-2000:]
    (line,) = verdicts(bad.output)
    assert line.startswith(
        f"locust decode suite: SLO breached (p90 TTFT <= 5000 ms, TPOT <= 0.5 ms; exit "
        f"{EXIT_SLO_BREACH}): step 0 (2 streams): p90 TPOT "
    )
    none = run_locust(url, tmp_path / "none", "-u", "1", *SHORT)
    assert none.returncode == 0 and verdicts(none.output) == []  # no SLO given, no verdict


def test_help_lists_the_suites_options() -> None:
    """Through python -m glmserve.loadtest: Locust prints `locust -f decode.py --help` before it
    imports the locustfile, so only a command that registers the suite first can list them."""
    proc = subprocess.run([sys.executable, "-m", "glmserve.loadtest", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "glmserve decode suite" in proc.stdout
    for option in ("--shape", "--slo-tpot-ms", "--report-dir", "--measure-s", "--users"):
        assert option in proc.stdout, option


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--slo-tpot-ms", "fast"], "locust decode suite: --slo-tpot-ms 'fast' is not a number"),
        (["--slo-ttft-ms", "1s"], "locust decode suite: --slo-ttft-ms '1s' is not a number"),
        (["--seed", "x"], "locust decode suite: --seed 'x' is not an integer"),
    ],
)
def test_a_bad_value_names_its_option(tmp_path: Path, args, line) -> None:
    run = run_locust("http://127.0.0.1:1", tmp_path / "rep", *args)
    assert run.returncode == 2, run.output[-2000:]
    assert line in run.output.splitlines() and "Traceback" not in run.output


def test_an_unwritable_report_dir_is_refused_before_the_run(sse_server, tmp_path: Path) -> None:
    """Before: the whole run, then exit 4 and no results. Now: one line, exit 2, no load."""
    url = sse_server("ok")
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    started = time.monotonic()
    run = run_locust(url, in_the_way / "report", "-u", "1", "--warmup-s", "0", "--measure-s", "30")
    assert run.returncode == 2, run.output[-2000:]
    assert time.monotonic() - started < 25  # refused at start, not after the 30 s measurement
    assert (
        f"locust decode suite: --report-dir {in_the_way / 'report'} is not writable "
        "(Not a directory); the report goes there"
    ) in run.output.splitlines()
    missing = tmp_path / "new" / "dir"  # a folder that does not exist yet is fine, and made later
    assert run_locust(url, missing, "-u", "1", *SHORT).returncode == 0
    assert (missing / "summary.json").is_file()


def test_a_refused_request_shows_its_status_code(sse_server, tmp_path: Path) -> None:
    url = sse_server("ok", "http_status")
    run = run_locust(url, tmp_path / "rep", "-u", "1", *SHORT, "--csv", str(tmp_path / "loc"))
    rows = list(csv.DictReader((tmp_path / "loc_failures.csv").open()))
    # Locust wraps it (CatchResponseError('...')); one row, with the code.
    (row,) = rows
    assert "'http_status: HTTP 503'" in row["Error"], rows
    assert run.summary["failures_total"]["http_status"] > 0  # the report keeps the reason


@pytest.mark.parametrize("refusal", ["open loop", "report dir"])
def test_a_refused_run_in_several_processes_leaves_no_worker_behind(tmp_path, refusal) -> None:
    """With --processes, Locust forks the workers before the suite reads its options. A worker
    that had not reached the master when the master refused (a loaded machine; here it never
    can: its master port refuses connections) retried for five minutes after the master was
    gone, holding the caller's pipes. Now the refusal stops the workers and returns at once."""
    with socket.socket() as bound, socket.socket() as never_listens:
        bound.bind(("127.0.0.1", 0))
        never_listens.bind(("127.0.0.1", 0))  # bound, never listening: connections refused
        master_bind_port = bound.getsockname()[1]
        bound.close()
        cluster = ["--processes", "2", "--master-bind-host", "127.0.0.1",
                   "--master-bind-port", str(master_bind_port),
                   "--master-port", str(never_listens.getsockname()[1])]  # fmt: skip
        if refusal == "open loop":
            report, args = tmp_path / "rep", ["--rate", "5"]
        else:
            (tmp_path / "a-file").write_text("")
            report, args = tmp_path / "a-file" / "report", ["-u", "1"]
        run = run_locust("http://127.0.0.1:9", report, *args, *cluster, timeout_s=60)
    assert run.returncode == 2, run.output[-2000:]
    lines = [ln for ln in run.output.splitlines() if ln.startswith("locust decode suite: ")]
    assert len(lines) == 1, lines
    assert "Traceback" not in run.output, run.output[-2000:]  # Locust's exit hook, too
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if str(report) in " ".join(p.info["cmdline"] or [])]  # fmt: skip
    assert left == [], f"Locust processes of the refused run still running: {left}"
