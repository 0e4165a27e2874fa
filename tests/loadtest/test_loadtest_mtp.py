"""Under MTP the report states where TPOT comes from: tokens per decode step (as the client saw
them) and the acceptance length, from each request's meta_info where the server sends it
(/generate), else from SGLang's gauge read as each step's window closed; none of it without
speculative decoding."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from support.locust_run import run_locust

from glmserve.loadtest.results import Collector, StepResult, Window, speculative_summary
from glmserve.loadtest.session import Session
from glmserve.loadtest.stages import Tick
from glmserve.streaming import Aggregate, StreamTiming
from glmserve.testing.emulator import emulator_process

ACCEPT = 2.5  # the emulator's steps of 2 and 3 tokens


def timing(tokens: int, events: int, verify: int | None = None) -> StreamTiming:
    return StreamTiming(ack_s=0.1, ttft_s=0.1, tpot_s=0.01, itl_s=(0.01,) * (tokens - 1),
                        e2e_s=1.0, output_tokens=tokens, prompt_tokens=5, events=events,
                        token_events=events, spec_verify_ct=verify)  # fmt: skip


def step(*timings: StreamTiming, server: dict | None = None) -> StepResult:
    agg = Aggregate()
    for t in timings:
        agg.add(t)
    return StepResult(0, 1, 10.0, agg, server)


def test_per_request_acceptance_wins_over_the_servers_gauge():
    got = speculative_summary(step(timing(21, 9, verify=8), server={"accept_length": 9.9}))
    assert got["accept_length"] == pytest.approx(21 / 8)
    assert got["accept_length_source"] == "meta_info"
    assert got["tokens_per_step"] == pytest.approx(20 / 8)


def test_the_servers_gauge_where_requests_carry_no_count():
    server = {"accept_length": 2.4, "accept_rate": 0.47}
    got = speculative_summary(step(timing(21, 9), server=server))
    assert (got["accept_length"], got["accept_length_source"]) == (2.4, "server metrics")
    assert got["accept_rate"] == 0.47


def test_without_mtp_only_tokens_per_step_is_stated():
    got = speculative_summary(step(timing(10, 10)))
    assert got == {"tokens_per_step": 1.0, "accept_length": None,
                   "accept_length_source": None, "accept_rate": None}  # fmt: skip


def test_the_session_reads_the_server_once_per_measured_window():
    """At the next step's first tick (the window closes) and at the end of the run; never
    for a window still warming up."""
    reads = []
    session = Session(options=None)  # type: ignore[arg-type]  # not read here
    session.collector = Collector()
    session.server_sampler = lambda: reads.append(1) or {"accept_length": float(len(reads))}

    class Env:
        runner = None

    session.on_phase(Tick(0, "warmup", 1, 1.0), 0.0, Env())
    session.on_phase(Tick(0, "measure", 1, 1.0), 1.0, Env())
    session.on_phase(Tick(1, "warmup", 2, 1.0), 2.0, Env())
    session.close(3.0)  # step 1 never reached its measurement
    windows = session.collector.windows
    assert len(reads) == 1 and windows[0].server == {"accept_length": 1.0}
    assert windows[1].server is None
    assert isinstance(windows[0], Window)


@pytest.mark.parametrize(
    ("route", "source"), [("chat", "server metrics"), ("generate", "meta_info")]
)
def test_locust_against_the_emulator_in_mtp_mode(route: str, source: str, tmp_path: Path):
    args = ["--tpot-ms", "10", "--ttft-ms", "50", "--speculative-accept-length", str(ACCEPT),
            "--decode-log-interval", "4"]  # fmt: skip
    with emulator_process(args) as emu:
        run = run_locust(emu.url, tmp_path / "rep", "-u", "4", "--warmup-s", "2",
                         "--measure-s", "4", "--max-tokens", "41", "--route", route)  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    (s,) = run.summary["steps"]
    # 40 decode tokens in 16 steps of 2 and 3 per request.
    assert s["tokens_per_step"] == pytest.approx(ACCEPT)
    assert s["accept_length_source"] == source
    # meta_info counts the prefill's token too (41 / 16); the gauge is the steps' own mean.
    assert 2.0 <= s["accept_length"] <= 3.0
    assert run.summary["server"]["speculative_algorithm"] == "EAGLE"
    with (tmp_path / "rep" / "steps.csv").open() as fh:
        header, row = list(csv.reader(fh))[:2]
    cols = dict(zip(header, row, strict=True))
    tpot_at = header.index("tpot_mean_ms")
    assert header[tpot_at + 1 : tpot_at + 3] == ["tokens_per_step", "accept_length"]
    assert float(cols["tokens_per_step"]) == pytest.approx(ACCEPT)
    with (tmp_path / "rep" / "requests.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["tokens_per_step"] for r in rows if r["ok"] == "1"} == {"2.5000"}
