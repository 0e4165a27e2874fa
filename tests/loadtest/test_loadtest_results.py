"""Per-step windows, SLO verdicts, goodput and the report files (no Locust in this process)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from glmserve.loadtest.options import LoadTestOptions, OptionsError
from glmserve.loadtest.report import write_report
from glmserve.loadtest.results import SLO, Collector, RequestRecord, StepResult, Window
from glmserve.loadtest.session import Session
from glmserve.streaming import Aggregate, StreamTiming


def timing(ttft: float, tpot: float, n: int = 5) -> StreamTiming:
    return StreamTiming(
        ack_s=ttft / 2, ttft_s=ttft, tpot_s=tpot, itl_s=(tpot,) * (n - 1),
        e2e_s=ttft + tpot * (n - 1), output_tokens=n, prompt_tokens=7, events=n, token_events=n,
    )  # fmt: skip


def ok(start: float, t: StreamTiming) -> RequestRecord:
    return RequestRecord(start, start + t.e2e_s, t)


def test_window_keeps_requests_started_in_step_and_ended_in_measurement() -> None:
    """Warm-up completions and requests left over from the previous step are not measured."""
    w = Window(step=1, streams=2, start=10.0, measure_start=12.0, end=20.0)
    t = timing(0.1, 0.01)  # e2e 0.14 s
    assert w.holds(ok(12.5, t))
    assert not w.holds(ok(10.5, t))  # ended during warm-up
    assert not w.holds(ok(9.95, t))  # started in the previous step
    assert not w.holds(ok(19.95, t))  # ended after the step
    assert w.measured_s() == 8.0


def test_collector_phases_open_and_close_windows() -> None:
    c = Collector()
    c.phase(0, 1, "warmup", 0.0)
    c.phase(0, 1, "measure", 1.0)
    c.phase(1, 2, "measure", 3.0)  # a step whose warm-up tick was skipped
    c.close(5.0)
    assert [(w.step, w.start, w.measure_start, w.end) for w in c.windows] == [
        (0, 0.0, 1.0, 3.0),
        (1, 3.0, 3.0, 5.0),
    ]


def test_steps_split_records_and_count_failures_by_reason() -> None:
    c = Collector()
    c.phase(0, 1, "warmup", 0.0)
    c.phase(0, 1, "measure", 1.0)
    c.close(11.0)
    for i in range(10):
        c.add(ok(1.0 + i, timing(0.2, 0.02)))
    c.add(RequestRecord(2.0, 2.5, None, "timeout"))
    c.add(RequestRecord(0.1, 0.2, None, "connect"))  # warm-up failure: run total only
    (step,) = c.steps()
    assert len(step.aggregate.timings) == 10
    assert step.aggregate.failures == {"timeout": 1}
    assert c.failures_total() == {"connect": 1, "timeout": 1}


def test_wire_round_trip_keeps_every_field() -> None:
    rec = ok(5.0, timing(0.3, 0.03))
    assert RequestRecord.from_wire(json.loads(json.dumps(rec.to_wire()))) == rec
    fail = RequestRecord(1.0, 2.0, None, "broken_stream")
    assert RequestRecord.from_wire(fail.to_wire()) == fail


def step_of(*timings: StreamTiming, window_s: float = 10.0) -> StepResult:
    agg = Aggregate()
    for t in timings:
        agg.add(t)
    return StepResult(0, 4, window_s, agg)


def test_slo_breach_is_judged_at_the_chosen_percentile() -> None:
    """9 fast + 1 slow request: p50 meets a 50 ms TTFT SLO, p99 does not."""
    step = step_of(*[timing(0.040, 0.01)] * 9, timing(0.500, 0.01))
    assert SLO(50.0, None, 50.0).check(step) == []
    (breach,) = SLO(50.0, None, 99.0).check(step)
    assert "TTFT" in breach and "> SLO 50 ms" in breach


def test_slo_without_samples_is_a_breach() -> None:
    assert SLO(None, 20.0, 90.0).check(step_of()) != []


def test_goodput_counts_requests_meeting_both_slos_per_second() -> None:
    step = step_of(timing(0.04, 0.010), timing(0.04, 0.030), timing(0.40, 0.010), window_s=2.0)
    assert step.aggregate.goodput(2.0, 0.1, 0.02) == pytest.approx(0.5)


def make_session(tmp: Path, **opts) -> Session:
    s = Session(LoadTestOptions(report_dir=str(tmp / "rep"), **opts))
    c = s.collector
    c.phase(0, 1, "warmup", 0.0)
    c.phase(0, 1, "measure", 1.0)
    c.phase(1, 2, "warmup", 11.0)
    c.phase(1, 2, "measure", 12.0)
    c.close(22.0)
    for i in range(8):
        c.add(ok(1.0 + i, timing(0.05, 0.010)))
        c.add(ok(12.0 + i, timing(0.05, 0.030)))
    c.add(RequestRecord(13.0, 14.0, None, "malformed_sse"))
    return s


def test_report_files_and_per_step_slo(tmp_path: Path) -> None:
    """The SLO holds at 1 stream and breaks at 2: the summary says which, and exit must fail."""
    session = make_session(tmp_path, shape="sweep", streams=2, slo_tpot_ms=20.0)
    out = write_report(session, "http://127.0.0.1:1", str(tmp_path))
    names = sorted(p.name for p in out.directory.iterdir())
    assert names == ["goodput.csv", "latency_histograms.png", "pareto.json", "pareto.png",
                     "requests.csv", "steps.csv", "summary.json", "sweep.png"]  # fmt: skip
    summary = json.loads((out.directory / "summary.json").read_text())
    s0, s1 = summary["steps"]
    assert (s0["streams"], s0["slo_passed"], s1["streams"], s1["slo_passed"]) == (1, True, 2, False)
    assert s1["failures"] == {"malformed_sse": 1}
    assert s0["tpot_ms"]["p50"] == pytest.approx(10.0)
    assert s0["output_tokens_per_s"] == pytest.approx(8 * 5 / 10.0)
    assert summary["slo"]["max_streams_within_slo"] == 1
    assert out.breaches and "TPOT" in out.breaches[0]
    rows = list(csv.DictReader((out.directory / "steps.csv").open()))
    assert [r["streams"] for r in rows] == ["1", "2"]
    assert float(rows[1]["tpot_p50_ms"]) == pytest.approx(30.0)
    reqs = list(csv.DictReader((out.directory / "requests.csv").open()))
    assert sum(r["ok"] == "0" for r in reqs) == 1 and len(reqs) == 17


def test_requests_csv_puts_each_record_in_the_step_the_summary_counts_it_in(tmp_path: Path) -> None:
    """One rule maps records to steps: a failure that started in the previous step but ended in
    this one's measurement is this step's failure in summary.json and in requests.csv alike."""
    session = make_session(tmp_path)
    session.collector.add(RequestRecord(10.5, 12.5, None, "timeout"))  # began in step 0
    session.collector.add(ok(0.2, timing(0.05, 0.010)))  # ended in step 0's warm-up: no step
    out = write_report(session, "http://127.0.0.1:1", str(tmp_path))
    steps = {
        s["step"]: s for s in json.loads((out.directory / "summary.json").read_text())["steps"]
    }
    assert steps[1]["failures"] == {"malformed_sse": 1, "timeout": 1}
    reqs = list(csv.DictReader((out.directory / "requests.csv").open()))
    by_reason = {r["reason"]: r["step"] for r in reqs if r["ok"] == "0"}
    assert by_reason == {"timeout": "1", "malformed_sse": "1"}
    assert reqs[0]["started_at"].startswith("0.2") and reqs[0]["step"] == ""


def test_failed_rows_past_the_cap_are_one_counted_row_per_step_and_reason(tmp_path: Path) -> None:
    """80,000 failed requests once meant 80,000 rows: past FAILED_ROWS_PER_REASON per step and
    reason they are summed into one row, and no failure goes uncounted."""
    from glmserve.loadtest.report import FAILED_ROWS_PER_REASON

    session = make_session(tmp_path)
    for i in range(FAILED_ROWS_PER_REASON + 150):
        session.collector.add(RequestRecord(12.0 + i / 1000, 13.0, None, "broken_stream"))
    out = write_report(session, "http://127.0.0.1:1", str(tmp_path))
    reqs = list(csv.DictReader((out.directory / "requests.csv").open()))
    broken = [r for r in reqs if r["reason"] == "broken_stream"]
    assert len(broken) == FAILED_ROWS_PER_REASON + 1
    assert [int(r["count"]) for r in broken] == [1] * FAILED_ROWS_PER_REASON + [150]
    assert broken[-1]["step"] == "1" and float(broken[-1]["started_at"]) == pytest.approx(12.1)
    assert sum(int(r["count"]) for r in reqs if r["ok"] == "0") == FAILED_ROWS_PER_REASON + 151
    assert all(r["count"] == "1" for r in reqs if r["ok"] == "1")


def test_report_without_measurement_has_nulls_not_nan(tmp_path: Path) -> None:
    session = Session(LoadTestOptions(report_dir="r", slo_ttft_ms=100.0))
    session.collector.phase(0, 1, "warmup", 0.0)
    session.collector.close(0.5)  # stopped during warm-up
    out = write_report(session, "", str(tmp_path))
    text = (out.directory / "summary.json").read_text()
    assert "NaN" not in text
    assert json.loads(text)["steps"][0]["ttft_ms"]["p50"] is None
    assert out.breaches  # an SLO that could not be checked is not a pass


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("streams", 0, "--users"),
        ("max_tokens", 0, "--max-tokens"),
        ("slo_tpot_ms", -1.0, "--slo-tpot-ms"),
        ("slo_percentile", 0.0, "--slo-percentile"),
        ("shape", "ramp", "--shape"),
        ("measure_s", math.inf, "--measure-s"),
    ],
)
def test_bad_options_give_one_clear_line(field: str, value, message: str) -> None:
    with pytest.raises(OptionsError, match=message) as err:
        LoadTestOptions(**{field: value})
    assert "\n" not in str(err.value)


def test_sweep_cannot_run_until_stopped() -> None:
    with pytest.raises(OptionsError, match="sweep"):
        LoadTestOptions(shape="sweep", measure_s=0.0)


def test_plots_show_failures_the_slo_and_an_incomplete_run(tmp_path) -> None:
    """The banner names failures and an early stop (latency curves cannot); steps without a
    completed request still plot; a sweep writes both files."""
    from glmserve.loadtest.report import _banner, write_plots
    from glmserve.loadtest.results import SLO, StepResult
    from glmserve.streaming import Aggregate

    healthy, dying = Aggregate(), Aggregate()
    for _ in range(4):
        healthy.add(timing(0.3, 0.03))
        dying.add(timing(0.4, 0.05))
    for _ in range(30):
        dying.fail("connect")
    dying.fail("timeout")
    steps = [StepResult(0, 1, 5.0, healthy), StepResult(1, 2, 5.0, dying),
             StepResult(2, 4, 5.0, Aggregate())]  # fmt: skip
    banner = _banner(steps, "SIGTERM")
    assert banner.splitlines() == [
        "INCOMPLETE run, stopped early: SIGTERM",
        "31 requests FAILED (connect 30, timeout 1) against 8 timed: failures are not in the "
        "latency plots",
    ]
    assert _banner(steps[:1], None) == ""
    written = write_plots(tmp_path, steps, SLO(500.0, 40.0, 90.0), "SIGTERM")
    assert [p.name for p in written] == ["latency_histograms.png", "sweep.png"]
    assert all(p.stat().st_size > 10_000 for p in written)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert write_plots(empty, [StepResult(0, 1, 5.0, Aggregate())])[0].is_file()
