"""Load shapes are stage tables; tick() only looks the run time up in them."""

from __future__ import annotations

import math

import pytest

from glmserve.loadtest.options import LoadTestOptions
from glmserve.loadtest.stages import Stage, StagePlayer, plan, ramp_rate, sweep_levels, tick_at


@pytest.mark.parametrize(
    ("n", "levels"),
    [
        (1, [1]),
        (2, [1, 2]),
        (4, [1, 2, 4]),
        (6, [1, 2, 4, 6]),
        (128, [1, 2, 4, 8, 16, 32, 64, 128]),
    ],
)
def test_sweep_levels_double_and_end_on_n(n: int, levels: list[int]) -> None:
    assert sweep_levels(n) == levels


def test_single_is_exactly_one_stream_whatever_users_say() -> None:
    assert plan("single", 64, 2.0, 10.0) == [Stage(1, 2.0, 10.0, 1.0)]
    assert LoadTestOptions.from_namespace(_ns(shape="single", num_users=64)).streams == 1


def test_concurrent_holds_n_and_zero_measure_means_until_stopped() -> None:
    assert plan("concurrent", 8, 1.0, 5.0) == [Stage(8, 1.0, 5.0, 16.0)]
    (stage,) = plan("concurrent", 8, 1.0, 0.0)
    assert stage.measure_s == math.inf
    assert tick_at([stage], 1e9).users == 8


# (run_time, expected (step, phase, users) or None) for a 1..4 sweep, 2 s warm-up + 3 s measure.
SWEEP_TABLE = [
    (0.0, (0, "warmup", 1)),
    (1.99, (0, "warmup", 1)),
    (2.0, (0, "measure", 1)),
    (4.99, (0, "measure", 1)),
    (5.0, (1, "warmup", 2)),
    (7.5, (1, "measure", 2)),
    (10.0, (2, "warmup", 4)),
    (14.99, (2, "measure", 4)),
    (15.0, None),
]


@pytest.mark.parametrize(("t", "want"), SWEEP_TABLE)
def test_sweep_tick_table(t: float, want: tuple[int, str, int] | None) -> None:
    got = tick_at(plan("sweep", 4, 2.0, 3.0), t)
    if want is None:
        assert got is None
    else:
        assert got is not None
        assert (got.step, got.phase, got.users) == want
        # A step's new streams start over the first half of its 2 s warm-up (1 s).
        assert got.spawn_rate == got.users - (got.users // 2 if got.users > 1 else 0)


def test_shape_reports_each_phase_change_once_then_stops() -> None:
    """The player returns Locust's (users, rate) and announces each phase change once."""
    seen: list[tuple[int, str]] = []
    ended: list[float] = []
    player = StagePlayer(
        plan("sweep", 2, 1.0, 1.0),
        on_phase=lambda tick, at: seen.append((tick.step, tick.phase)),
        on_end=ended.append,
        wall=lambda: 100.0,
    )
    results = [player.tick(t) for t in (0.0, 0.5, 1.0, 1.5, 2.0, 3.5, 4.0)]
    assert results == [(1, 2.0), (1, 2.0), (1, 2.0), (1, 2.0), (2, 2.0), (2, 2.0), None]
    assert seen == [(0, "warmup"), (0, "measure"), (1, "warmup"), (1, "measure")]
    assert ended == [100.0]


def test_run_time_ends_the_run_and_says_it_was_cut_short() -> None:
    """Locust applies -t only after a shape has finished; the player applies it itself."""
    ended: list[float] = []
    player = StagePlayer(plan("sweep", 4, 1.0, 1.0), on_end=ended.append, wall=lambda: 7.0,
                         limit_s=3.0)  # fmt: skip
    assert player.tick(2.9) == (2, 2.0)
    assert player.tick(3.0) is None
    assert player.finished and player.cut_short and not player.reached_last and ended == [7.0]
    whole = StagePlayer(plan("sweep", 4, 1.0, 1.0), limit_s=60.0)
    assert [whole.tick(t) is None for t in (0.0, 4.5, 6.0)] == [False, False, True]
    assert whole.finished and whole.reached_last and not whole.cut_short


def test_new_streams_start_over_half_the_warm_up() -> None:
    """Spread starts keep equal-length streams out of lock-step (their TTFT would then carry
    the burst of N simultaneous requests); no warm-up means start at once."""
    assert ramp_rate(64, 10.0) == pytest.approx(64 / 5.0)
    assert ramp_rate(64, 0.0) == 64.0
    assert [s.spawn_rate for s in plan("sweep", 8, 4.0, 1.0)] == [0.5, 0.5, 1.0, 2.0]


def test_unknown_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown shape"):
        plan("ramp", 4, 1.0, 1.0)


def _ns(**over):
    from types import SimpleNamespace

    base = dict(
        shape="concurrent", num_users=1, warmup_s=0.0, measure_s=1.0, route="chat",
        model="m", max_tokens=4, input_tokens=4, prompt_file="", seed="", request_timeout_s=5.0,
        read_timeout_s=5.0, slo_ttft_ms="", slo_tpot_ms="", slo_percentile=90.0,
        report_dir="r", build_info="", itl_stats="on",
    )  # fmt: skip
    base.update(over)
    return SimpleNamespace(**base)


def test_failures_back_off_doubling_to_a_cap() -> None:
    """A sick target fails in microseconds: each user waits 0.1, 0.2, 0.4 ... s, at most 5 s
    (docs/loadtest.md, Failures); so no 10 s holds more than 2 failures per user per second."""
    from glmserve.loadtest.stages import backoff_s

    assert [backoff_s(n) for n in range(8)] == [0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0]
    assert backoff_s(100) == 5.0
    pauses = [backoff_s(n) for n in range(1, 1000)]
    for start in range(len(pauses) - 20):  # failures taking no time at all: the worst case
        elapsed, count = 0.0, 0
        while elapsed < 10.0:
            elapsed += pauses[start + count]
            count += 1
        assert count <= 20, (start, count)
