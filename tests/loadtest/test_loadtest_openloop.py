"""Open loop without Locust: arrival processes, the dispatcher's missed arrivals, the ledger's
queue verdict, the rate-sweep plan and its rate decision."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from glmserve.loadtest.arrivals import Dispatcher, gaps, offsets, sweep_rates
from glmserve.loadtest.openloop import ArrivalRecord, OpenLoop, arrival_summary, capacity_line
from glmserve.loadtest.options import LoadTestOptions, OptionsError, parse_rates
from glmserve.loadtest.results import RequestRecord
from glmserve.loadtest.session import Session
from glmserve.loadtest.stages import RATE_PENDING, Stage, StagePlayer, plan_run
from glmserve.streaming import StreamTiming
from glmserve.testing.queueing import fcfs_waits


def take(it, n):
    return [next(it) for _ in range(n)]


def test_constant_gaps_are_exact_and_start_half_a_gap_in() -> None:
    assert take(gaps("constant", 4.0, random.Random(1)), 3) == [0.25, 0.25, 0.25]
    assert take(offsets("constant", 4.0, 1), 3) == [0.125, 0.375, 0.625]


@pytest.mark.parametrize(("kind", "burstiness", "cv"), [("poisson", 1.0, 1.0), ("gamma", 0.25, 2.0),
                                                       ("gamma", 4.0, 0.5)])  # fmt: skip
def test_random_gaps_have_mean_one_over_rate_and_their_spread(kind, burstiness, cv) -> None:
    sample = take(gaps(kind, 5.0, random.Random(3), burstiness), 40_000)
    assert statistics.fmean(sample) == pytest.approx(0.2, rel=0.03)
    assert statistics.stdev(sample) / statistics.fmean(sample) == pytest.approx(cv, rel=0.05)


def test_a_seed_replays_the_arrivals_and_another_does_not() -> None:
    assert take(offsets("poisson", 5.0, "7:0"), 50) == take(offsets("poisson", 5.0, "7:0"), 50)
    assert take(offsets("poisson", 5.0, "7:1"), 5) != take(offsets("poisson", 5.0, "7:0"), 5)


def test_bad_process_or_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown arrival"):
        next(gaps("burst", 1.0, random.Random()))
    with pytest.raises(ValueError, match="rate"):
        next(gaps("poisson", 0.0, random.Random()))


def test_dispatcher_hands_out_in_order_and_counts_what_nobody_sent() -> None:
    missed: list[int] = []
    d = Dispatcher(100.0, iter([0.0, 1.0, 2.0, 3.0, 4.0, 10.0]), lambda i, due: missed.append(i),
                   max_lag_s=0.05)  # fmt: skip
    a = d.claim(99.0)  # a free sender takes the first arrival ahead of time
    assert (a.index, a.due) == (0, 100.0)
    b = d.claim(99.5)
    assert (b.index, b.due) == (1, 101.0)
    # Every sender was busy until 103.02: arrival 2 (due 102) is 1.02 s late, so missed;
    # arrival 3 (due 103) is 20 ms late, within the limit, so it is sent.
    c = d.claim(103.02)
    assert c.index == 3 and missed == [2]
    assert d.still_open_for(c)
    d.close(104.5)  # arrival 4 (due 104) was never taken; 10 is after the end: no step's
    assert missed == [2, 4]
    assert d.claim(105.0) is None
    late = Dispatcher(0.0, iter([1.0, 5.0]), lambda i, due: missed.append(i))
    slot = late.claim(0.5)
    late.close(2.0)  # its sender slept past the end of the step: missed, not sent
    assert not late.still_open_for(slot) and missed[-1] == 0


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_ledger_records_lag_in_flight_and_missed_arrivals() -> None:
    clock = FakeClock()
    ol = OpenLoop("constant", seed=1, clock=clock, wall=lambda: 1000.0 + clock.t)
    ol.begin(0, 2.0)  # arrivals at 0.25, 0.75, 1.25, ...
    d, slot = ol.claim()
    clock.t = 0.26
    assert ol.send(d, slot)  # 10 ms late
    d2, slot2 = ol.claim()
    clock.t = 0.75
    assert ol.send(d2, slot2)
    assert ol.in_flight == 2
    clock.t = 2.0  # nobody free for 1.25 and 1.75
    ol.done()
    ol.end()
    lags = [r.lag_s for r in ol.records]
    assert lags[0] == pytest.approx(0.01) and lags[1] == pytest.approx(0.0)
    assert lags[2:] == [None, None]
    assert [r.in_flight for r in ol.records] == [0, 1, 1, 1]
    assert ol.records[0].due_at == pytest.approx(1000.25)


def records(rate: float, seconds: float, in_flight) -> list[ArrivalRecord]:
    n = int(rate * seconds)
    return [ArrivalRecord(0, i / rate, 0.001, in_flight(i / rate)) for i in range(n)]


def test_queue_verdict_tells_a_wandering_queue_from_a_growing_one() -> None:
    rng = random.Random(5)
    stable = arrival_summary(records(5, 60, lambda t: 7 + rng.randint(-4, 4)), 0, 0, 60, 5.0)
    assert not stable["queue_grows"] and stable["missed"] == 0
    assert stable["arrival_rps"] == pytest.approx(5.0, rel=0.01)
    growing = arrival_summary(records(12, 10, lambda t: 2 + 9 * t), 0, 0, 10, 12.0)
    assert growing["queue_grows"]
    assert growing["in_flight"]["growth_per_s"] == pytest.approx(9.0, rel=0.01)
    line = capacity_line("step 0 (12 req/s)", growing)
    assert "above capacity at 12 requests/s" in line and "queue grows" in line
    # A few arrivals without a free sender: said, but no verdict on the server.
    short = [*records(5, 10, lambda t: 3), ArrivalRecord(0, 5.0, None, 3)]
    few = arrival_summary(short, 0, 0, 10, 5.0, senders=3)
    assert not few["queue_grows"] and few["missed"] == 1
    assert "1 of 51 arrivals found all 3 senders busy" in capacity_line("x", few)
    # Every sender busy all window long: the count cannot climb, arrivals are turned away.
    pinned = records(5, 10, lambda t: 8)
    pinned += [ArrivalRecord(0, t + 0.1, None, 8) for t in range(10)]
    assert arrival_summary(pinned, 0, 0, 10, 5.0, senders=8)["queue_grows"] is False
    pinned += [ArrivalRecord(0, t + 0.3, None, 8) for t in range(10)]
    assert arrival_summary(pinned, 0, 0, 10, 5.0, senders=8)["queue_grows"] is True
    assert capacity_line("x", stable) is None


def test_sweep_rates_lie_strictly_between() -> None:
    assert sweep_rates(1.0, 5.0, 3) == [2.0, 3.0, 4.0]
    assert sweep_rates(3.0, 3.0, 3) == [] and sweep_rates(0.0, 5.0, 2) == []


def test_rate_sweep_plan_and_repeats() -> None:
    stages = plan_run("rate-sweep", 1, 2.0, 5.0, senders=16, sweep_count=2, repeats=2)
    assert [(s.role, s.streams, s.level, s.repeat) for s in stages[:4]] == [
        ("synchronous", 1, 0, 0), ("throughput", 16, 1, 0), ("", 16, 2, 0), ("", 16, 3, 0),
    ]  # fmt: skip
    assert all(s.pending for s in stages[2:4]) and len(stages) == 8
    assert [s.repeat for s in stages[4:]] == [1] * 4
    given = plan_run("rate-sweep", 1, 1.0, 3.0, rates=(2.0, 4.0), senders=8)
    assert [(s.rate, s.streams, s.role) for s in given] == [(2.0, 8, ""), (4.0, 8, "")]
    (one,) = plan_run("concurrent", 4, 1.0, 3.0, rates=(5.0,), senders=32)
    assert one.rate == 5.0 and one.label == "5 req/s" and one.spawn_rate == 32
    assert plan_run("concurrent", 4, 1.0, 3.0, rates=(5.0,), senders=500)[0].spawn_rate == 100
    (closed,) = plan_run("concurrent", 4, 1.0, 3.0)
    assert closed.rate is None and closed.label == "4 streams"


def test_player_decides_pending_rates_when_it_reaches_them_or_stops_with_a_reason() -> None:
    stages = [Stage(1, 1, 1, 1, role="synchronous"), Stage(4, 1, 1, 4, role="throughput"),
              Stage(4, 1, 1, 4, rate=RATE_PENDING, level=2)]  # fmt: skip
    calls = []

    def resolve(current):
        calls.append(len(current))
        return [s if not s.pending else Stage(4, 1, 1, 4, rate=3.0, level=2) for s in current]

    player = StagePlayer(list(stages), resolve=resolve)
    assert player.tick(2.5) == (4, 4) and calls == []
    assert player.tick(4.5) == (4, 4) and calls == [3]
    assert player.stages[2].rate == 3.0
    stopper = StagePlayer(list(stages), resolve=lambda s: "no rates")
    assert stopper.tick(4.5) is None
    assert stopper.cut_short and stopper.stop_reason == "no rates"


def timing(e2e: float) -> StreamTiming:
    return StreamTiming(ack_s=0.05, ttft_s=0.05, tpot_s=0.02, itl_s=(0.02,), e2e_s=e2e,
                        output_tokens=2, prompt_tokens=8, events=2, token_events=2)  # fmt: skip


def test_session_decides_the_sweep_rates_from_littles_law() -> None:
    """Synchronous: 1 stream at 0.5 s per request = 2 req/s; throughput: 8 streams at 1 s =
    8 req/s; two rates between them: 4 and 6."""
    s = Session(LoadTestOptions(shape="rate-sweep", sweep_count=2))
    stages = plan_run("rate-sweep", 1, 1.0, 10.0, senders=8, sweep_count=2)
    c = s.collector
    c.phase(0, 1, "warmup", 0.0)
    c.phase(0, 1, "measure", 1.0)
    c.phase(1, 8, "warmup", 11.0)
    c.phase(1, 8, "measure", 12.0)
    for i in range(10):
        c.add(RequestRecord(1.0 + i, 1.5 + i, timing(0.5)))
        c.add(RequestRecord(12.0 + i, 13.0 + i, timing(1.0)))
    resolved = s.resolve_rates(stages)
    assert [st.rate for st in resolved[2:]] == pytest.approx([4.0, 6.0])
    empty = Session(LoadTestOptions(shape="rate-sweep"))
    assert "timed no request" in empty.resolve_rates(stages)


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ({"shape": "sweep", "rates": (5.0,)}, "--rate works with --shape concurrent"),
        ({"rates": (2.0, 4.0)}, "several --rate values need --shape rate-sweep"),
        ({"rates": (0.0,)}, "--rate must be requests per second > 0"),
        ({"burstiness": 0.5}, "--burstiness shapes --arrivals gamma only"),
        ({"shape": "rate-sweep", "measure_s": 0.0}, "does not work with --shape rate-sweep"),
        ({"repeats": 0}, "--repeats must be >= 1"),
        ({"dataset": "a", "prompt_file": "b"}, "give one"),
    ],
)
def test_bad_open_loop_options_are_one_line(opts, message) -> None:
    with pytest.raises(OptionsError, match=message):
        LoadTestOptions(**opts)


def test_rates_parse_as_a_list() -> None:
    assert parse_rates("2, 4.5,8") == (2.0, 4.5, 8.0) and parse_rates("") == ()
    with pytest.raises(OptionsError, match="--rate 'fast'"):
        parse_rates("fast")


def test_fcfs_waits_replay_a_sample_path() -> None:
    # Two slots, 1 s service: the third arrival waits for the first slot to free at 1.0.
    assert fcfs_waits([0.0, 0.1, 0.2, 1.5], 1.0, 2) == pytest.approx([0.0, 0.0, 0.8, 0.0])
    assert math.isclose(sum(fcfs_waits([0.0] * 3, 1.0, 1)), 3.0)


@pytest.mark.parametrize("warmup_s", [0.0, 2.0])
def test_a_steps_arrivals_start_with_its_first_tick_and_end_with_the_next_step(warmup_s) -> None:
    """With or without a warm-up; a closed-loop step after an open one has no arrivals."""
    from glmserve.loadtest.stages import tick_at

    s = Session(LoadTestOptions(rates=(4.0,)))
    s.open_loop = OpenLoop("constant", seed=1)
    stages = [Stage(8, warmup_s, 3.0, 8, rate=4.0), Stage(2, warmup_s, 3.0, 2)]
    s.on_phase(tick_at(stages, 0.0), 0.0, environment=type("E", (), {"runner": None})())
    assert s.open_loop.dispatcher is not None and s.open_loop.step == 0
    s.on_phase(tick_at(stages, warmup_s + 3.0), 5.0, environment=type("E", (), {"runner": None})())
    assert s.open_loop.dispatcher is None
