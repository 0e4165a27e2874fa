"""`make demo`, the README's no-GPU demo, as CI runs it (the session's `emulated_stack` IS the
demo): what it prints, Locust through it, the Prometheus page in a real headless browser, and
the doctor stopping bad input before anything starts (in the demo and in compose itself)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest
from support.locust_run import LOCUSTFILE
from support.net import free_port
from support.stack import EMULATOR_TPOT_MS, REPO, Stack, run

pytestmark = pytest.mark.stack

FAKE_GLM5 = REPO / "tests" / "fixtures" / "glm5-nvfp4"
TPOT_RULE = "glmserve:canary_tpot_seconds:quantile5m"


def demo_lines(stack: Stack) -> list[str]:
    return stack.log.splitlines()


def tpot_link(stack: Stack) -> str:
    (line,) = [ln for ln in demo_lines(stack) if ln.strip().startswith("TPOT p50/p90/p99")]
    return line.split(": ", 1)[1].strip()


def test_the_demo_says_what_it_did_and_where_to_look(emulated_stack: Stack) -> None:
    lines = demo_lines(emulated_stack)
    prometheus = emulated_stack.prometheus_url
    assert lines[0].startswith("glmserve.doctor: ok: "), lines[:3]
    pinned_base_here = (
        subprocess.run(
            ["docker", "image", "inspect", "prom/prometheus:v3.5.0"], capture_output=True
        ).returncode
        == 0
    )
    stand_ins = [ln for ln in lines if ln.startswith("demo: no registry for ")]
    assert len(stand_ins) == (0 if pinned_base_here else 1), lines
    if stand_ins:
        (at,) = [i for i, ln in enumerate(lines) if ln.startswith("demo: for other docker compose")]
        assert lines[at].endswith("add these lines to .env:")
        # As .env takes them, one per line: pasted as printed, the doctor accepts them.
        assert lines[at + 1 : at + 3] == [
            "TOOLS_BASE_IMAGE=glmserve-ci/python:3.11-bookworm",
            "PROMETHEUS_IMAGE=glmserve-ci/prometheus:2.42-bookworm",
        ]
        pasted = Path(tempfile.mkdtemp(prefix="glmserve-demo-")) / "pasted.env"
        pasted.write_text("\n".join(lines[at + 1 : at + 3]) + "\n")
        doctor = subprocess.run(
            [sys.executable, "-m", "glmserve.doctor", "--in-compose", "--project-dir", str(REPO),
             "--env-file", str(pasted)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert doctor.returncode == 0, doctor.stderr
    grafana = [ln for ln in lines if ln.startswith("demo: ") and "Grafana" in ln]
    assert len(grafana) == 1 and grafana[0].startswith("demo: Grafana left out: "), grafana
    assert any(re.fullmatch(r"demo: up in \d+ s: emulator exporter prometheus", ln) for ln in lines)
    assert f"  Prometheus              {prometheus}" in lines
    assert (
        f"  exporter                http://127.0.0.1:{emulated_stack.ports['exporter']}/metrics"
        in lines
    )
    links = [ln for ln in lines if ln.startswith("  TPOT") and f"{prometheus}/graph?" in ln]
    assert len(links) == 2, lines
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(tpot_link(emulated_stack)).query)
    assert query["g0.expr"] == [TPOT_RULE]
    preview = f"  .venv/bin/python -m glmserve.dashboard.preview --prometheus {prometheus} --output dashboard-preview.png"
    assert preview in lines
    assert any(
        ln.startswith("  . .venv/bin/activate && locust -f loadtest/decode.py") for ln in lines
    )


def test_locust_from_the_venv_reports_the_emulators_tpot_within_2_percent(
    emulated_stack: Stack, tmp_path: Path
) -> None:
    """The demo's Locust line (`locust` from the activated venv), shortened to a few seconds."""
    locust = Path(sys.executable).with_name("locust")
    assert locust.is_file(), "the venv has no locust command"
    proc = subprocess.run(
        [str(locust), "-f", str(LOCUSTFILE), "--headless", "-H", emulated_stack.sglang_url,
         "-u", "4", "--warmup-s", "1", "--measure-s", "5", "--max-tokens", "32",
         "--slo-tpot-ms", "50", "--report-dir", str(tmp_path), "--only-summary"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    (step,) = summary["steps"]
    assert step["requests"] > 0 and not summary["failures_total"]
    print(
        f"Locust p50 TPOT {step['tpot_ms']['p50']:.3f} ms (emulator --tpot-ms {EMULATOR_TPOT_MS})"
    )
    assert step["tpot_ms"]["p50"] == pytest.approx(EMULATOR_TPOT_MS, rel=0.02)


@pytest.fixture(scope="module")
def chromium(require_fn: Callable[[bool, str], None]) -> str:
    found = shutil.which("chromium")
    require_fn(found is not None, "no chromium on PATH (apt-get install chromium; .ci/run does)")
    assert found is not None
    return found


def headless(chromium: str, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Chromium without a display; the page's own scripts get 10 s (virtual time) to draw."""
    home = tempfile.mkdtemp(prefix="glmserve-chromium-")
    try:
        return subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--window-size=1400,1000", "--virtual-time-budget=10000",
             f"--user-data-dir={home}", *args, url],
            capture_output=True, text=True, timeout=90, env={**os.environ, "HOME": home},
        )  # fmt: skip
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_the_prometheus_tpot_link_shows_the_series_in_a_real_browser(
    emulated_stack: Stack, chromium: str, tmp_path: Path
) -> None:
    """The demo's TPOT link, opened in Debian's Chromium: the page's legend names the TPOT
    quantile series and the screenshot shows the p50 line in its legend colour across the plot."""
    p50 = f'{TPOT_RULE}{{quantile="0.5"}}'
    # The demo's link over the last 30 s (15 m by default), once the rule has filled them (1 s
    # evaluations here), so that the line spans the plot. Not 10 s: on a loaded 2-core machine
    # the page loads seconds after the wait, and a rule evaluation or two late left the line
    # over only 36 % of a 10 s plot (one CI run).
    emulated_stack.wait_for_series(f"count_over_time({p50}[30s]) >= 27", timeout_s=150)
    link = tpot_link(emulated_stack).replace("g0.range_input=15m", "g0.range_input=30s")
    assert "range_input=30s" in link
    dom = headless(chromium, link, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    legend = re.findall(
        r'<div class="swatch" style="background-color: rgb\((\d+), (\d+), (\d+)\);"></div>'
        r'<span class="label">([^<]+)</span>',
        dom.stdout,
    )
    series = {label.replace("&quot;", '"'): tuple(map(int, rgb)) for *rgb, label in legend}
    assert p50 in series, f"legend: {sorted(series)}"
    assert len(re.findall(r'<path class="path" d="M[\d.]+,[\d.]+L', dom.stdout)) >= len(series)

    shot = tmp_path / "prometheus-tpot.png"
    png = headless(chromium, link, f"--screenshot={shot}")
    assert png.returncode == 0 and shot.is_file(), png.stderr[-2000:]
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    colour = series[p50]
    pixels = image.load()
    columns = {
        x
        for x in range(image.width)
        for y in range(image.height)
        if all(abs(a - b) <= 12 for a, b in zip(pixels[x, y], colour, strict=True))
    }
    # The legend's swatch is ~10 columns wide; the p50 line runs along most of the plot.
    print(f"p50 line colour {colour} in {len(columns)} of {image.width} columns")
    assert len(columns) > image.width * 0.5


def _bad_input_env(stack: Stack, project: str, **bad: str) -> dict[str, str]:
    env = {**stack.env, "COMPOSE_PROJECT_NAME": project, "SGLANG_PORT": str(free_port())}
    env.update(bad)
    return env


def _containers(env: dict[str, str]) -> list[str]:
    return run(
        ["docker", "compose", "--profile", "emulated", "ps", "-a", "-q"], env=env
    ).stdout.split()


def test_a_bad_value_stops_the_demo_before_anything_starts(emulated_stack: Stack) -> None:
    env = _bad_input_env(
        emulated_stack, f"glmserve-baddemo-{os.getpid()}", EMULATOR_TPOT_MS="2O",
        EXPORTER_CANARY_INTERVAL="soon",
    )  # fmt: skip
    proc = run(["make", "--no-print-directory", "demo"], env=env, check=False, timeout=120)
    assert proc.returncode != 0
    doctor = [ln for ln in proc.stderr.splitlines() if ln.startswith("glmserve.doctor: ")]
    assert doctor == [
        "glmserve.doctor: EMULATOR_TPOT_MS='2O' (environment): python -m glmserve.emulator: "
        "error: argument --tpot-ms: invalid float value: '2O' (see --help)",
        "glmserve.doctor: EXPORTER_CANARY_INTERVAL='soon' (environment): glmserve-exporter: "
        "error: flag: canary.interval: not a duration: 'soon' (use e.g. 500ms, 15s, 1m)",
    ], proc.stderr
    assert _containers(env) == []


def test_compose_runs_the_doctor_before_any_service(emulated_stack: Stack) -> None:
    """`docker compose up` itself: the doctor service fails, so the emulator never starts, and
    its log holds the emulator's own message about the value."""
    env = _bad_input_env(emulated_stack, f"glmserve-baddoctor-{os.getpid()}", EMULATOR_TPOT_MS="2O")
    base = ["docker", "compose", "--profile", "emulated"]
    try:
        up = run([*base, "up", "-d", "--no-build", "emulator"], env=env, check=False, timeout=120)
        assert up.returncode != 0, up.stdout + up.stderr
        assert "doctor" in up.stderr
        logs = run([*base, "logs", "--no-color", "--no-log-prefix", "doctor"], env=env).stdout
        assert logs.strip().splitlines() == [
            "glmserve.doctor: EMULATOR_TPOT_MS='2O' (environment): python -m glmserve.emulator: "
            "error: argument --tpot-ms: invalid float value: '2O' (see --help)"
        ]
        ids = run([*base, "ps", "-a", "-q", "emulator"], env=env).stdout.split()
        for cid in ids:
            state = json.loads(
                run(["docker", "inspect", "--format", "{{json .State}}", cid]).stdout
            )
            assert state["StartedAt"].startswith("0001-01-01"), state  # created, never started
    finally:
        run([*base, "down", "-v", "-t", "5"], env=env, check=False, timeout=120)


def test_the_launcher_dry_run_needs_no_server_image(emulated_stack: Stack) -> None:
    """`docker compose run --rm launcher --dry-run`, as the README writes it: the tools image,
    no SGLang base, no ulimits; the server image's name points at nothing here."""
    env = {
        **emulated_stack.env,
        "COMPOSE_PROJECT_NAME": f"glmserve-dry-{os.getpid()}",
        "MODEL_DIR": str(FAKE_GLM5),
        "GLMSERVE_IMAGE": "glmserve-test/no-such-server:absent",
        "GLMSERVE_PULL_POLICY": "never",  # the tools image is built; `run` must not rebuild it
    }
    base = ["docker", "compose", "--progress", "quiet", "--profile", "launcher"]
    started = time.monotonic()
    try:
        proc = run([*base, "run", "--rm", "-T", "launcher", "--dry-run"], env=env, timeout=120)
    finally:
        run([*base, "down", "-v", "-t", "5"], env=env, check=False, timeout=120)
    report = json.loads(proc.stdout)
    assert report["profile"] == "glm5-nvfp4-rtxpro6000-tp8" and report["model_path"] == "/model"
    assert report["model_path_on_host"] == str(FAKE_GLM5)  # the MODEL_DIR the user set
    assert report["argv"][1:3] == ["-m", "sglang.launch_server"]
    assert report["sglang"]["version"].startswith("not installed here")
    print(f"launcher dry run in {time.monotonic() - started:.1f} s")
